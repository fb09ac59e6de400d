package leakcheck

import (
	"testing"
	"time"
)

func TestLeakedFindsARunningGoroutineAndNotAFinishedOne(t *testing.T) {
	before := ids(stacks())
	stop := make(chan struct{})
	go func() { <-stop }()
	if left := Leaked(before, 50*time.Millisecond); len(left) != 1 {
		t.Fatalf("want the one goroutine blocked on stop, got %d:\n%v", len(left), left)
	}
	close(stop)
	if left := Leaked(before, 5*time.Second); len(left) != 0 {
		t.Fatalf("the goroutine ended, but still reported:\n%v", left)
	}
}
