package phases

import (
	"context"
	"time"

	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/phases/cniapi"
	"github.com/phasegate/phasegate/phases/slotsapi"
)

// runRegister is the register phase: the Slots API bound on the port and
// on the control socket (with /debug/slots and the CNI plugin's routes
// there), and the expiry of
// leases started (task leases).
func (d *Daemon) runRegister(_ context.Context, p *lifecycle.Progress) error {
	// The port serves the Slots API only to clients with a verified
	// certificate (the guard refuses the others); the control socket to
	// whom the kernel names.
	api := slotsapi.New(d.slots)
	if err := d.app.Server().Bind(slotsapi.ServiceName, api); err != nil {
		return lifecycle.Permanent(err)
	}
	if err := d.ctl.srv.Bind(slotsapi.ServiceName, api); err != nil {
		return lifecycle.Permanent(err)
	}
	if err := d.ctl.srv.BindHTTP(pathDebugSlots, d.ctl.guard.HTTP(api.DebugHandler())); err != nil {
		return lifecycle.Permanent(err)
	}
	degraded := func() string { return warningsLine(d.lc.Snapshot()) }
	if err := cniapi.Bind(d.ctl.srv.BindHTTP, d.ctl.guard, d.slots, degraded); err != nil {
		return lifecycle.Permanent(err)
	}
	if err := d.bindHeld(); err != nil {
		return lifecycle.Permanent(err)
	}
	p.Defer(taskLeases, func(ctx context.Context, _ *lifecycle.Progress) error {
		if err := d.slots.RunExpiry(ctx, time.Second); ctx.Err() == nil {
			return err
		}
		return ctx.Err()
	})
	return nil
}
