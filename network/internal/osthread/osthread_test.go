package osthread_test

import (
	"testing"

	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/network/internal/osthread"
)

// fn runs on a thread other than the main one, and a thread fn ran on is
// never seen again by the calling goroutines: each run gets a new one.
func TestThrowawayNeverReusesAThread(t *testing.T) {
	seen := map[int]bool{}
	for range 20 {
		var tid int
		osthread.Throwaway(func() { tid = unix.Gettid() })
		if tid == unix.Getpid() {
			t.Fatal("fn ran on the main thread")
		}
		if seen[tid] {
			t.Fatalf("thread %d ran fn twice: it was handed back to Go", tid)
		}
		seen[tid] = true
	}
}
