package phases

import (
	"context"
	"strings"

	"github.com/phasegate/phasegate/network/hostcheck"
)

// checkEgress says what the slots' traffic to the outside needs and the
// host does not give: a log line each and a health warning.
func (d *Daemon) checkEgress(ctx context.Context) {
	rep := hostcheck.Check(ctx, hostcheck.Config{Table: d.mgr.Firewall().Name(), HostIfPrefix: d.cfg.Slots.HostIfPrefix()})
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
