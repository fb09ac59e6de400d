package lockfile

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"testing"
)

func TestAcquireCIDR(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name       string
		held, want string
		scope      string // of want; the held CIDR is in "neta"
		refused    bool
	}{
		{"equal", "10.1.0.0/24", "10.1.0.0/24", "neta", true},
		{"inside", "10.1.0.0/24", "10.1.0.128/25", "neta", true},
		{"around", "10.1.0.0/24", "10.0.0.0/15", "neta", true},
		{"disjoint", "10.1.0.0/24", "10.1.1.0/24", "neta", false},
		{"adjacent", "10.1.0.0/25", "10.1.0.128/25", "neta", false},
		{"another network namespace", "10.1.0.0/24", "10.1.0.0/24", "netb", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			held, err := AcquireCIDR(ctx, dir, "neta", netip.MustParsePrefix(tc.held))
			if err != nil {
				t.Fatal(err)
			}
			defer held.Unlock()
			l, err := AcquireCIDR(ctx, dir, tc.scope, netip.MustParsePrefix(tc.want))
			var he *CIDRHeldError
			switch {
			case tc.refused && !errors.As(err, &he):
				t.Fatalf("AcquireCIDR(%s) beside %s = %v, want a CIDRHeldError", tc.want, tc.held, err)
			case tc.refused:
				if he.Held.String() != tc.held || he.Lock.PID != os.Getpid() {
					t.Errorf("refusal names %s held by pid %d, want %s by pid %d: %v", he.Held, he.Lock.PID, tc.held, os.Getpid(), err)
				}
			case err != nil:
				t.Fatalf("AcquireCIDR(%s) beside %s: %v", tc.want, tc.held, err)
			default:
				l.Unlock()
			}
		})
	}
}

// A CIDR lock its holder let go (or a holder that died: the kernel drops
// its flock) does not refuse the next daemon, though its file stays.
func TestAcquireCIDRAfterRelease(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	l, err := AcquireCIDR(ctx, dir, "neta", netip.MustParsePrefix("10.2.0.0/16"))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Unlock(); err != nil {
		t.Fatal(err)
	}
	l, err = AcquireCIDR(ctx, dir, "neta", netip.MustParsePrefix("10.2.3.0/24"))
	if err != nil {
		t.Fatalf("after the release: %v", err)
	}
	l.Unlock()
}

// The lock files of CIDRs nobody holds (their daemons died) are removed by
// the next taker; those held stay.
func TestAcquireCIDRRemovesStaleFiles(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	stale, err := AcquireCIDR(ctx, dir, "neta", netip.MustParsePrefix("10.3.0.0/24"))
	if err != nil {
		t.Fatal(err)
	}
	stale.Unlock() // as a kill -9 leaves it: the file, no lock
	held, err := AcquireCIDR(ctx, dir, "neta", netip.MustParsePrefix("10.4.0.0/24"))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Unlock()
	l, err := AcquireCIDR(ctx, dir, "neta", netip.MustParsePrefix("10.5.0.0/24"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unlock()
	for cidr, want := range map[string]bool{"10.3.0.0/24": false, "10.4.0.0/24": true, "10.5.0.0/24": true} {
		_, err := os.Stat(CIDRPath(dir, "neta", netip.MustParsePrefix(cidr)))
		if got := err == nil; got != want {
			t.Errorf("lock file of %s exists: %v, want %v", cidr, got, want)
		}
	}
}
