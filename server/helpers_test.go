package server_test

import (
	"testing"
	"time"
)

// waitUntil polls cond until it holds, failing after wait. It stands for
// conditions another goroutine makes true shortly after the test acted.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}
