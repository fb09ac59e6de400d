package slot

import (
	"errors"
	"testing"
	"time"
)

// An interrupted dump is tried again, what it gathered dropped each time,
// until one is whole; a host that changes on every try for the whole
// budget fails with the interruption wrapped, and any other error ends the
// tries at once.
func TestRetryDump(t *testing.T) {
	errOther := errors.New("netlink: permission denied")
	for _, tc := range []struct {
		name        string
		interrupted int   // tries interrupted before the outcome
		outcome     error // of the try after them
		wantTries   int   // at least
		wantErr     error
	}{
		{"whole at once", 0, nil, 1, nil},
		{"whole after three interrupted", 3, nil, 4, nil},
		{"another error ends the tries", 2, errOther, 3, errOther},
		{"interrupted for the whole budget", 1 << 30, nil, 2, errDumpInterrupted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var tries, resets, gathered int
			err := retryDump(50*time.Millisecond, func() error {
				tries++
				gathered++
				if tries <= tc.interrupted {
					return errDumpInterrupted
				}
				return tc.outcome
			}, func(err error) bool { return errors.Is(err, errDumpInterrupted) }, func() { resets++; gathered = 0 })
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) {
				t.Fatalf("err %v, want %v", err, tc.wantErr)
			}
			if tries < tc.wantTries || (tc.interrupted < 1<<30 && tries != tc.wantTries) {
				t.Errorf("%d tries, want %d", tries, tc.wantTries)
			}
			if resets != tries || gathered != 1 {
				t.Errorf("%d resets for %d tries, %d gathered by the last: every try must start afresh", resets, tries, gathered)
			}
		})
	}
}
