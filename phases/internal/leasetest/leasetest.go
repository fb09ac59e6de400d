// Package leasetest holds what the tests of the daemon's rooms share.
//
// The lease core's, the Slots API's and the CNI adapter's tests each need
// a slot host of their own on the real kernel, swept at the end, a pool
// over it, and callers as the control surface's guard leaves them.
package leasetest

import (
	"context"
	"fmt"
	mathbits "math/bits"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/control"
	"github.com/phasegate/phasegate/network/egress"
	"github.com/phasegate/phasegate/network/index"
	"github.com/phasegate/phasegate/network/leases"
	"github.com/phasegate/phasegate/network/pool"
	"github.com/phasegate/phasegate/network/slot"
)

// NewSlotHost makes a slot manager for n slots in a netns directory and
// with a prefix and CIDR of its own, swept at the end, and a state file.
// Its egress defaults are the daemon's without the host's addresses. It
// skips a test not run as root.
func NewSlotHost(t testing.TB, n int) (slot.Config, *slot.Manager, *leases.Store) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces)")
	}
	// A /31 per slot, in whole /24s.
	bits := max(8, mathbits.Len(uint(2*n-1)))
	blocks := 1 << (bits - 8)
	prefix := "ph"
	for range 4 {
		prefix += string(rune('a' + rand.IntN(26)))
	}
	cfg := slot.Config{
		Prefix: prefix + "-", NetnsDir: filepath.Join(t.TempDir(), "netns"), Slots: n,
		CIDR: netip.MustParsePrefix(fmt.Sprintf("100.%d.%d.0/%d", 64+rand.IntN(64), rand.IntN(256)&^(blocks-1), 32-bits)),
	}
	ctx := context.Background()
	opts := slot.DefaultOptions()
	opts.Egress = egress.Defaults{AlwaysDeny: egress.DefaultAlwaysDeny} // the daemon's, without the host's addresses
	mgr, err := slot.NewManager(ctx, cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if inv, err := mgr.Scan(ctx); err == nil {
			if res := mgr.Teardown(ctx, inv, slot.TeardownOptions{}); res.Err() != nil {
				t.Errorf("sweep: %v", res.Err())
			}
		} else {
			t.Errorf("sweep: %v", err)
		}
		if err := mgr.Firewall().Delete(ctx); err != nil {
			t.Errorf("sweep: %v", err)
		}
		for unix.Unmount(cfg.NetnsDir, unix.MNT_DETACH) == nil {
		}
	})
	store, err := leases.Open(filepath.Join(t.TempDir(), "slots.db"), leases.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	return cfg, mgr, store
}

// NewPool makes a pool of mgr's n slots with target warm, closed at the
// end, once target are warm. The leases lost records as lost at a
// restart: recorded in store, their index taken, no slot.
func NewPool(t testing.TB, mgr *slot.Manager, store *leases.Store, n, target int, lost ...leases.Record) *pool.Pool {
	t.Helper()
	ctx := context.Background()
	idx, err := index.New(n, nil)
	if err != nil {
		t.Fatal(err)
	}
	var lostIdx []int
	for _, rec := range lost {
		if err := idx.Claim(rec.Index); err != nil {
			t.Fatal(err)
		}
		if err := store.Put(ctx, rec); err != nil {
			t.Fatal(err)
		}
		lostIdx = append(lostIdx, rec.Index)
	}
	pl, err := pool.New(mgr, idx, pool.Options{Target: target, Lost: lostIdx})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pl.Close(context.Background()) })
	if err := pl.WaitReady(ctx, target); err != nil {
		t.Fatal(err)
	}
	return pl
}

// Principals of the tests: root on the socket, and two unprivileged users.
var (
	Root   = control.Principal{Kind: control.Unix}
	Alice  = control.Principal{Kind: control.Unix, UID: 1001, GID: 1001}
	Mallet = control.Principal{Kind: control.Unix, UID: 65534, GID: 65534}
)

// As returns ctx as the guard leaves it for a call of pr under policy p
// (nil: no rule, root alone may act).
func As(ctx context.Context, pr control.Principal, p *control.AccessPolicy) context.Context {
	return control.WithCaller(ctx, CallerOf(pr, p))
}

// CallerOf is the caller pr is under policy p (nil: no rule).
func CallerOf(pr control.Principal, p *control.AccessPolicy) control.Caller {
	if p == nil {
		p = &control.AccessPolicy{}
	}
	return control.Caller{Principal: pr, Grant: p.Grant(pr)}
}

// WaitUntil polls cond every 10 ms for up to a minute, and fails the test
// naming what it waited for if cond never held.
func WaitUntil(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

// Printable reports whether s is printable ASCII alone.
func Printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}

// PolicyOf is a control policy of rules (as the --control-rule flag
// spells them), with a quota of maxLeases each (0: none).
func PolicyOf(t testing.TB, maxLeases int, rules ...string) *control.AccessPolicy {
	t.Helper()
	p := &control.AccessPolicy{MaxLeases: &maxLeases}
	for _, r := range rules {
		rule, err := control.ParseRule(r, false)
		if err != nil {
			t.Fatal(err)
		}
		p.Rules = append(p.Rules, rule)
	}
	return p
}
