// Package serialteardown is the per-slot teardown of E2B's orchestrator
// before its fix, kept in the test module as the baseline the benchmarks
// measure phasegate against: strictly one slot after the other, delete the
// host firewall state, delete the host veth with netlink (the kernel waits
// out an RCU grace period for each), delete the netns. phasegate itself
// never tears down this way (network/slot's Manager.Teardown hands the
// kernel the namespaces in batches), which is why this lives here and not
// in the library: it is written against the library's exported parts only.
package serialteardown

import (
	"context"
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/network/netns"
	"github.com/phasegate/phasegate/network/slot"
)

// Teardown tears down the slots of inv one at a time, in index order, and
// reports them as Manager.Teardown does (Reclaimed, Failed, Deferred). It
// starts at most maxSlots of them (0: all), so that a benchmark can
// measure the per-slot cost on a subset of a large leaked set; the rest,
// and everything left once ctx ends, is Deferred. progress, if set, is
// called after each slot with the count so far and len(inv).
func Teardown(ctx context.Context, m *slot.Manager, inv slot.Inventory, maxSlots int, progress func(done, total int)) *slot.TeardownResult {
	res := &slot.TeardownResult{}
	indices := inv.Indices()
	for k, i := range indices {
		if ctx.Err() != nil || (maxSlots > 0 && k >= maxSlots) {
			res.Deferred = append(res.Deferred, indices[k:]...)
			break
		}
		if err := one(ctx, m, i); err != nil {
			res.Failed = append(res.Failed, slot.Failure{Index: i, Err: err})
		} else {
			res.Reclaimed = append(res.Reclaimed, i)
		}
		if progress != nil {
			progress(k+1, len(indices))
		}
	}
	return res
}

// one tears down slot i: its set element, its host veth, its netns file.
// Each step runs whatever the others did, so that a slot with only some
// of its resources left is still removed as far as it can be.
func one(ctx context.Context, m *slot.Manager, i int) error {
	cfg := m.Config()
	var errs []error
	if cfg.HostIfFits(i) { // else no link nor element can exist
		if err := m.Firewall().Remove(ctx, cfg.HostIfName(i)); err != nil {
			errs = append(errs, err)
		}
		if l, err := netlink.LinkByName(cfg.HostIfName(i)); err == nil {
			if err := netlink.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
				errs = append(errs, fmt.Errorf("delete link %s: %w", cfg.HostIfName(i), err))
			}
		}
	}
	if err := netns.Delete(ctx, cfg.NetnsDir, cfg.NetnsName(i)); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
