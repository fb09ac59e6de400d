package phases

import (
	"context"
	"errors"
	"fmt"
	"strings"

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
// handed over across an upgrade. The lock comes before the host check
// (checkHost), so two daemons starting at the same instant cannot both
// pass it; an upgrade's new image does not check the host again: what is
// there is its own.
func (d *Daemon) claimCIDR(ctx context.Context) error {
	scope, err := lockfile.NetNSScope()
	if err != nil {
		return lifecycle.Permanent(err)
	}
	path := lockfile.CIDRPath(d.cfg.LockDir, scope, d.cfg.Slots.CIDR)
	if f := d.app.Inherited(cidrHandover); f != nil {
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
	d.checkHost = true
	d.app.HandOver(cidrHandover, l.File())
	return nil
}

// acquireCIDR takes the CIDR lock in the network namespace scope names:
// an equal or overlapping CIDR held, or a lock directory another user
// could change, is a configuration error.
func (d *Daemon) acquireCIDR(ctx context.Context, scope string) (*lockfile.Lock, error) {
	l, err := lockfile.AcquireCIDR(ctx, d.cfg.LockDir, scope, d.cfg.Slots.CIDR)
	if held := (*lockfile.CIDRHeldError)(nil); errors.As(err, &held) {
		return nil, fmt.Errorf("%w: %v: give each daemon on a host a --slot-cidr of its own (docs/DEPLOYING.md)", ErrConfig, held)
	}
	return l, asConfig(err)
}

// checkHostCIDR refuses a slot CIDR, or a guest network, that overlaps an
// address or a route of the host other than the daemon's own slots' (a
// *cidrInUseError: the daemon exits 2). It runs with the CIDR lock held
// and before anything on the host is changed; not after an upgrade (see
// claimCIDR). Both ranges are checked from one read of the host's tables
// (slot.Config.ReadHost), which also gives the host addresses the egress
// defaults deny.
func (d *Daemon) checkHostCIDR() error {
	if !d.checkHost {
		return nil
	}
	read, err := d.cfg.Slots.ReadHost()
	if err != nil {
		return lifecycle.Permanent(err)
	}
	// The same dump's host addresses, for the egress defaults (populate).
	d.host.addrs, d.host.read = read.Addrs, true
	if uses := read.Foreign; len(uses) > 0 {
		d.log.Error("slot CIDR refused: the host already uses addresses in it", "cidr", d.cfg.Slots.CIDR.String(), "uses", describeUses(uses))
		return lifecycle.Permanent(&cidrInUseError{What: "--slot-cidr " + d.cfg.Slots.CIDR.String(), Uses: uses,
			Hint: "give this daemon a range nothing on the host uses (ip -4 addr; ip -4 route show table all)"})
	}
	if guest := read.Guest; len(guest) > 0 {
		return lifecycle.Permanent(d.guestRangeRefused(guest))
	}
	return nil
}

// describeUses is the uses for a log line.
func describeUses(uses []slot.HostUse) string {
	s := make([]string, len(uses))
	for i, u := range uses {
		s[i] = u.String()
	}
	return strings.Join(s, ", ")
}

// guestRangeRefused logs and returns the refusal of a guest network that
// overlaps the host's own addresses or routes (uses).
func (d *Daemon) guestRangeRefused(uses []slot.HostUse) error {
	r := d.cfg.Slots.Guest.Range().String()
	d.log.Error("guest network refused: the host already uses addresses in it", "range", r, "uses", describeUses(uses))
	return &cidrInUseError{What: "the guest network " + r + " (--slot-guest-addr)", Uses: uses,
		Hint: "every slot repeats it inside, so the host must not have it: give another --slot-guest-addr, or move what the host has there (another daemon's --slot-cidr, say)"}
}
