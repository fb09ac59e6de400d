package test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/network/slot"
	"github.com/phasegate/phasegate/phases/lockfile"
)

// e2eSpace is where the end-to-end hosts take their slot networks: the
// benchmarking range (RFC 2544), which no network routes and no other test
// package uses (they take link-local and 100.64.0.0/10 blocks), in /18s
// (8,192 slots, what the long load test leaks).
var e2eSpace = netip.MustParsePrefix("198.18.0.0/15")

const e2eBlockBits = 18

// claimCIDR returns a block of e2eSpace that no other host of a test holds
// while t runs and that nothing on the host uses: daemons now refuse a
// CIDR that overlaps another's, so two hosts must never share one. Each
// block is claimed with a lock file held until the test's cleanup (after
// the sweep).
func claimCIDR(t *testing.T, prefix string) string {
	t.Helper()
	dir := filepath.Join(os.TempDir(), "phasegate-e2e-cidr")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	scope, err := lockfile.NetNSScope()
	if err != nil {
		t.Fatal(err)
	}
	blocks := 1 << (e2eBlockBits - e2eSpace.Bits())
	start := rand.IntN(blocks)
	base := e2eSpace.Addr().As4()
	for i := range blocks {
		off := uint32((start+i)%blocks) << (32 - e2eBlockBits)
		v := uint32(base[0])<<24 | uint32(base[1])<<16 | off
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), e2eBlockBits)
		f, err := os.OpenFile(filepath.Join(dir, fmt.Sprintf("%s_%d", p.Addr(), p.Bits())), os.O_CREATE|os.O_RDWR, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
			f.Close()
			continue
		}
		// A daemon left by another run, or what a killed run left.
		free := false
		if l, err := lockfile.AcquireCIDR(context.Background(), lockfile.DefaultDir, scope, p); err == nil {
			l.Unlock()
			uses, err := slot.Config{Prefix: prefix, CIDR: p}.ForeignUses()
			free = err == nil && len(uses) == 0
		}
		if !free {
			f.Close()
			continue
		}
		t.Cleanup(func() { f.Close() })
		return p.String()
	}
	t.Fatalf("every /%d of %s is held or used on this host", e2eBlockBits, e2eSpace)
	return ""
}
