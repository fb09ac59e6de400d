package phases

import (
	"context"
	"fmt"
	"strings"

	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/network/hostcheck"
	"github.com/phasegate/phasegate/network/hostwatch"
)

// checkEgress says what the slots' traffic to the outside needs and the
// host does not give: a log line each and a health warning.
func (d *Daemon) checkEgress(ctx context.Context) {
	rep := hostcheck.Check(ctx, hostcheck.Config{Table: d.mgr.Firewall().Name(), HostIfPrefix: d.cfg.Slots.HostIfPrefix(), IPv6: d.cfg.Slots.IPv6()})
	var warn []string
	for _, pr := range rep.Problems {
		if pr.Kind == hostcheck.Unverifiable {
			d.log.Info("egress check: cannot verify", "problem", pr.Message)
			continue
		}
		d.log.Warn("egress check: slots cannot reach the outside", "kind", pr.Kind.String(), "problem", pr.Message)
		warn = append(warn, pr.Message)
	}
	if len(warn) > 0 {
		d.lc.Warn(warnEgress, strings.Join(warn, "; "))
	} else {
		d.lc.ClearWarning(warnEgress)
	}
	d.log.Info("egress check done", "warnings", len(warn))
}

// watchHost follows the host's network after the start (issue 48, item
// 7): what the start read of it is a snapshot, and a host gains an
// uplink, a VPN or a CNI bridge while the daemon runs. Once each burst of
// changes to the host's links, addresses and routes (the slots' own left
// out) settles, it reads the host again: an address or route that now
// overlaps the slot CIDR or the guest network is a health warning naming
// it (a start would have refused it; the daemon already runs, and its
// slots now compete with it for those addresses), and the egress check
// runs again, so that its warning follows the host's forwarding and
// routes rather than the start's.
func (d *Daemon) watchHost(ctx context.Context, _ *lifecycle.Progress) error {
	switch {
	case d.host.later:
		// The start left the host check until now (hostCheckedBefore).
		d.checkHostOverlap()
	case d.host.checked:
		// The start's check passed: the next start of this configuration
		// in this boot checks after its port.
		d.noteHostChecked(true)
	}
	prefix := d.cfg.Slots.Prefix
	err := hostwatch.Watch(ctx, hostwatch.Options{Ours: func(name string) bool { return strings.HasPrefix(name, prefix) }},
		func(ctx context.Context) {
			d.log.Info("the host's network changed: checking it again")
			d.checkHostOverlap()
			d.checkEgress(ctx)
		})
	if err != nil {
		// The start's checks stand; the daemon serves on.
		d.log.Warn("the host's network is not followed: its changes after the start go unseen until a restart", "error", err)
	}
	return nil
}

// checkHostOverlap reads the host again and warns of what overlaps the
// slot CIDR or the guest network, or clears the warning.
func (d *Daemon) checkHostOverlap() {
	read, err := d.cfg.Slots.ReadHost()
	if err != nil {
		d.log.Warn("the host's addresses and routes could not be read again", "error", err)
		return
	}
	var found []string
	add := func(what string, uses int, first fmt.Stringer) {
		if uses > 0 {
			found = append(found, fmt.Sprintf("%s overlaps what the host now uses: %s (%d in all)", what, first, uses))
		}
	}
	if f := read.Foreign; len(f) > 0 {
		add("--slot-cidr "+d.cfg.Slots.CIDR.String(), len(f), f[0])
	}
	if g := read.Guest; len(g) > 0 {
		add("the guest network "+d.cfg.Slots.Guest.Range().String(), len(g), g[0])
	}
	if uses, err := d.cfg.Slots.ForeignUses6(); err != nil {
		d.log.Warn("the host's IPv6 addresses and routes could not be read again", "error", err)
	} else if len(uses) > 0 {
		add("--slot-cidr6 "+d.cfg.Slots.CIDR6.String(), len(uses), uses[0])
	}
	if len(found) == 0 {
		d.lc.ClearWarning(warnHostOverlap)
		return
	}
	// The next start checks before the port again, and refuses.
	d.noteHostChecked(false)
	msg := strings.Join(found, "; ") + ": slots and the host now compete for those addresses; remove it from the host, or restart the daemon on another range"
	d.log.Warn("the host took addresses of the slots' ranges", "problem", msg)
	d.lc.Warn(warnHostOverlap, msg)
}
