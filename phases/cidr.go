package phases

import (
	"context"
	"errors"
	"fmt"

	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/network/slot"
	"github.com/phasegate/phasegate/phases/lockfile"
)

// cidrHandover names the CIDR lock's descriptor across an in-place
// upgrade, as lockHandover names the slots lock's.
const cidrHandover = "cidr-lock"

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

// claimCIDR takes the CIDR lock, refused while another daemon holds an
// equal or overlapping CIDR. It is held until the daemon stops, and
// handed over across an upgrade. The host check (checkHostCIDR) ran
// before it, in New: two daemons starting at the same instant may both
// pass that check, but only one of them gets this lock.
func (d *Daemon) claimCIDR(ctx context.Context) error {
	scope, err := lockfile.NetNSScope()
	if err != nil {
		return lifecycle.Permanent(err)
	}
	path := lockfile.CIDRPath(d.cfg.LockDir, scope, d.cfg.Slots.CIDR)
	if f := d.cidrHanded; f != nil {
		d.cidrHanded = nil
		legacy := lockfile.CIDRPath(lockfile.LegacyDir, scope, d.cfg.Slots.CIDR)
		l, err := d.adoptLock(f, path, legacy, func() (*lockfile.Lock, error) { return d.acquireCIDR(ctx, scope) })
		if err != nil {
			return lifecycle.Permanent(asConfig(fmt.Errorf("the CIDR lock handed over by the previous image: %w", err)))
		}
		d.cidrLock = l
		d.app.HandOver(cidrHandover, l.File())
		return nil
	}
	l, err := d.acquireCIDR(ctx, scope)
	if err != nil {
		return lifecycle.Permanent(err)
	}
	d.cidrLock = l
	d.app.HandOver(cidrHandover, l.File())
	return nil
}

// cidrHolder is the refusal of the slot CIDR naming the daemon that holds
// it, or one that overlaps it, in this network namespace; nil when none
// does (or the lock directory cannot tell).
func (d *Daemon) cidrHolder() error {
	scope, err := lockfile.NetNSScope()
	if err != nil {
		return nil
	}
	return cidrHeld(lockfile.CIDRHolder(context.Background(), d.cfg.LockDir, scope, d.cfg.Slots.CIDR))
}

// cidrHeld makes a *lockfile.CIDRHeldError a configuration error that says
// what to do; it is nil for any other err.
func cidrHeld(err error) error {
	if held := (*lockfile.CIDRHeldError)(nil); errors.As(err, &held) {
		return fmt.Errorf("%w: %v: give each daemon on a host a --slot-cidr of its own (docs/DEPLOYING.md)", ErrConfig, held)
	}
	return nil
}

// acquireCIDR takes the CIDR lock in the network namespace scope names:
// an equal or overlapping CIDR held, or a lock directory another user
// could change, is a configuration error.
func (d *Daemon) acquireCIDR(ctx context.Context, scope string) (*lockfile.Lock, error) {
	l, err := lockfile.AcquireCIDR(ctx, d.cfg.LockDir, scope, d.cfg.Slots.CIDR)
	if held := cidrHeld(err); held != nil {
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
// slots included: the CIDR lock is IPv4's), as checkHostCIDR does
// --slot-cidr; nothing without it.
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
