package phases

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"

	"github.com/phasegate/phasegate/app"
	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/network/slot"
	"github.com/phasegate/phasegate/phases/lockfile"
)

// cidrClaim is one range of the slots' addresses a daemon locks: the
// IPv4 CIDR, and the IPv6 one when the slots are dual-stack. Handover
// names the lock's descriptor across an in-place upgrade, as lockHandover
// names the slots lock's; flag is what a refusal tells the operator to
// change.
type cidrClaim struct {
	cidr           netip.Prefix
	handover, flag string
}

// cidrClaims are the ranges this daemon locks, IPv4's first.
func (d *Daemon) cidrClaims() []cidrClaim {
	cs := []cidrClaim{{d.cfg.Slots.CIDR, "cidr-lock", "--slot-cidr"}}
	if d.cfg.Slots.IPv6() {
		cs = append(cs, cidrClaim{d.cfg.Slots.CIDR6, "cidr6-lock", "--slot-cidr6"})
	}
	return cs
}

// inheritCIDRLocks takes the range locks the previous image handed over,
// and reports whether it handed the IPv4 one over: then this is an
// upgrade's new image, whose host is its own. An image from before the
// IPv6 lock hands over none of it; claimCIDR takes it then.
func (d *Daemon) inheritCIDRLocks(a *app.App) bool {
	d.cidrHanded = map[string]*os.File{}
	for _, c := range d.cidrClaims() {
		if f := a.Inherited(c.handover); f != nil {
			d.cidrHanded[c.handover] = f
		}
	}
	return d.cidrHanded[d.cidrClaims()[0].handover] != nil
}

// cidrInUseError refuses a slot CIDR, or a guest network, that overlaps
// addresses or routes of the host that are not the daemon's own slots.
type cidrInUseError struct {
	// What names the range refused ("--slot-cidr 10.0.0.0/16"); Hint says
	// what to do.
	What, Hint string
	// Uses are what overlaps it, the most telling first.
	Uses []slot.HostUse
}

func (e *cidrInUseError) Error() string {
	more := ""
	if n := len(e.Uses) - 1; n > 0 {
		more = fmt.Sprintf(" (and %d more)", n)
	}
	return fmt.Sprintf("%v: %s overlaps what the host already uses: %s%s; %s", ErrConfig, e.What, e.Uses[0], more, e.Hint)
}

// Unwrap makes the error a configuration error: the daemon exits 2.
func (e *cidrInUseError) Unwrap() error { return ErrConfig }

// claimCIDR takes the lock of each slot range (cidrClaims), refused
// while another daemon holds an equal or overlapping one. They are held
// until the daemon stops, and handed over across an upgrade. The host
// check (checkHostCIDR) ran before, in New: two daemons starting at the
// same instant may both pass that check, but only one of them gets these
// locks.
func (d *Daemon) claimCIDR(ctx context.Context) error {
	scope, err := lockfile.NetNSScope()
	if err != nil {
		return lifecycle.Permanent(err)
	}
	for _, c := range d.cidrClaims() {
		l, err := d.claimOne(ctx, scope, c)
		if err != nil {
			_ = d.unlockCIDRs()
			return lifecycle.Permanent(err)
		}
		d.cidrLocks = append(d.cidrLocks, l)
		d.app.HandOver(c.handover, l.File())
	}
	return nil
}

// claimOne takes range c's lock, or keeps the one the previous image
// handed over.
func (d *Daemon) claimOne(ctx context.Context, scope string, c cidrClaim) (*lockfile.Lock, error) {
	f := d.cidrHanded[c.handover]
	if f == nil {
		return d.acquireCIDR(ctx, scope, c)
	}
	delete(d.cidrHanded, c.handover)
	path := lockfile.CIDRPath(d.cfg.LockDir, scope, c.cidr)
	legacy := lockfile.CIDRPath(lockfile.LegacyDir, scope, c.cidr)
	l, err := d.adoptLock(f, path, legacy, func() (*lockfile.Lock, error) { return d.acquireCIDR(ctx, scope, c) })
	if err != nil {
		return nil, asConfig(fmt.Errorf("the CIDR lock handed over by the previous image: %w", err))
	}
	return l, nil
}

// unlockCIDRs lets go of the range locks, last taken first.
func (d *Daemon) unlockCIDRs() error {
	var errs []error
	for i := len(d.cidrLocks) - 1; i >= 0; i-- {
		errs = append(errs, d.cidrLocks[i].Unlock())
	}
	d.cidrLocks = nil
	return errors.Join(errs...)
}

// cidrHolder is the refusal of the slot CIDR naming the daemon that holds
// it, or one that overlaps it, in this network namespace; nil when none
// does (or the lock directory cannot tell).
func (d *Daemon) cidrHolder() error {
	scope, err := lockfile.NetNSScope()
	if err != nil {
		return nil
	}
	c := d.cidrClaims()[0]
	return cidrHeld(lockfile.CIDRHolder(context.Background(), d.cfg.LockDir, scope, c.cidr), c.flag)
}

// cidrHeld makes a *lockfile.CIDRHeldError a configuration error that says
// what to do (give flag another range); it is nil for any other err.
func cidrHeld(err error, flag string) error {
	if held := (*lockfile.CIDRHeldError)(nil); errors.As(err, &held) {
		return fmt.Errorf("%w: %v: give each daemon on a host a %s of its own (docs/DEPLOYING.md)", ErrConfig, held, flag)
	}
	return nil
}

// acquireCIDR takes range c's lock in the network namespace scope names:
// an equal or overlapping range held, or a lock directory another user
// could change, is a configuration error.
func (d *Daemon) acquireCIDR(ctx context.Context, scope string, c cidrClaim) (*lockfile.Lock, error) {
	l, err := lockfile.AcquireCIDR(ctx, d.cfg.LockDir, scope, c.cidr)
	if held := cidrHeld(err, c.flag); held != nil {
		return nil, held
	}
	return l, asConfig(err)
}

// checkHostCIDR refuses a slot CIDR, or a guest network, that overlaps an
// address or a route of the host other than the daemon's own slots' (a
// *cidrInUseError: the daemon exits 2, in one line). New runs it, before
// anything is locked, bound or made, so that the refusal leaves nothing
// behind; not in an upgrade's new image, whose host is its own. Both ranges
// are checked from one read of the host's tables (slot.Config.ReadHost),
// which also gives the host addresses the egress defaults deny (populate):
// the one read of them at a start.
func (d *Daemon) checkHostCIDR() error {
	read, err := d.cfg.Slots.ReadHost()
	if err != nil {
		return fmt.Errorf("the host check of --slot-cidr: %w", err)
	}
	d.host.addrs, d.host.read = read.Addrs, true
	d.host.checked = len(read.Foreign) == 0 && len(read.Guest) == 0
	if uses := read.Foreign; len(uses) > 0 {
		// Another daemon's slots are named by that daemon, not by a link.
		if held := d.cidrHolder(); held != nil {
			return held
		}
		return &cidrInUseError{What: "--slot-cidr " + d.cfg.Slots.CIDR.String(), Uses: uses,
			Hint: "give this daemon a range nothing on the host uses (ip -4 addr; ip -4 route show table all)"}
	}
	if err := d.checkHostCIDR6(); err != nil {
		return err
	}
	if guest := read.Guest; len(guest) > 0 {
		r := d.cfg.Slots.Guest.Range().String()
		return &cidrInUseError{What: "the guest network " + r + " (--slot-guest-addr)", Uses: guest,
			Hint: "every slot repeats it inside, so the host must not have it: give another --slot-guest-addr, or move what the host has there (another daemon's --slot-cidr, say)"}
	}
	return nil
}

// checkHostCIDR6 refuses --slot-cidr6 when it overlaps an IPv6 address or
// route of the host other than the daemon's own slots' (another daemon's
// slots included, found by their addresses), as checkHostCIDR does
// --slot-cidr; nothing without it. Two daemons starting at once are kept
// apart by the range locks (claimCIDR).
func (d *Daemon) checkHostCIDR6() error {
	uses, err := d.cfg.Slots.ForeignUses6()
	if err != nil {
		return fmt.Errorf("the host check of --slot-cidr6: %w", err)
	}
	if len(uses) > 0 {
		d.host.checked = false
		return &cidrInUseError{What: "--slot-cidr6 " + d.cfg.Slots.CIDR6.String(), Uses: uses,
			Hint: "give this daemon an IPv6 range nothing on the host uses (ip -6 addr; ip -6 route show table all)"}
	}
	return nil
}
