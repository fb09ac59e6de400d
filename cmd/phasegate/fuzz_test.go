package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// FuzzServeConfiguration feeds arbitrary flag values and environment
// variables to `serve` parsing and validation: it must never panic, and
// what it rejects it rejects with exit 2 and one line, before anything is
// created. (Validation only reads the file system.)
func FuzzServeConfiguration(f *testing.F) {
	f.Add("--slots=0", "PHASEGATE_POOL_SIZE", "3")
	f.Add("--slot-cidr=169.254.0.0/31", "PHASEGATE_SLOTS", "-4")
	f.Add("--listen=[::1]:99999", "PHASEGATE_DRAIN_DELAY", "1h")
	f.Add("--slot-prefix=a-very-long-prefix-", "PHASEGATE_LOG_FORMAT", "yaml")
	f.Add("--netns-dir=../x", "PHASEGATE_STATE_DIR", "")
	f.Fuzz(func(t *testing.T, arg, key, value string) {
		var stdout, stderr bytes.Buffer
		e := env{
			args:      []string{arg, "--state-dir=/nonexistent-fuzz/state"},
			lookupEnv: func(k string) (string, bool) { return value, k == key },
			stdout:    &stdout,
			stderr:    &stderr,
		}
		cfg, _, err := serveFlags(e)
		if err == nil {
			err = cfg.Validate()
		}
		// The state dir's parent does not exist, so nothing is valid and
		// serve never gets past validation.
		if err == nil {
			t.Fatalf("accepted %q %s=%q with a state dir whose parent is missing", arg, key, value)
		}
		if code := serveCmd(context.Background(), e); code != exitUsage && !(code == exitOK && strings.Contains(stdout.String(), "usage:")) {
			t.Fatalf("serve %q %s=%q: exit %d, want %d\n%s", arg, key, value, code, exitUsage, stderr.String())
		}
		if n := strings.Count(strings.TrimRight(stderr.String(), "\n"), "\n"); n > 0 {
			t.Fatalf("more than one line: %q", stderr.String())
		}
	})
}
