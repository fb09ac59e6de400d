package phases

import (
	"context"
	"time"

	"github.com/phasegate/phasegate/lifecycle"
)

// runRegister is the register phase: the Slots API bound on the port and
// on the control socket (with /debug/slots and the CNI plugin's routes
// there), and the expiry of
// leases started (task leases).
func (d *Daemon) runRegister(_ context.Context, p *lifecycle.Progress) error {
	// The port serves the Slots API only to clients with a verified
	// certificate (the guard refuses the others); the control socket to
	// whom the kernel names.
	if err := d.app.Server().Bind(slotsServiceName, d.slots); err != nil {
		return lifecycle.Permanent(err)
	}
	if err := d.ctl.Bind(slotsServiceName, d.slots); err != nil {
		return lifecycle.Permanent(err)
	}
	if err := d.ctl.BindHTTP(pathDebugSlots, d.ctlGuard.HTTP(d.slots.debugHandler())); err != nil {
		return lifecycle.Permanent(err)
	}
	if err := d.bindCNI(); err != nil {
		return lifecycle.Permanent(err)
	}
	if err := d.bindHeld(); err != nil {
		return lifecycle.Permanent(err)
	}
	p.Defer(taskLeases, func(ctx context.Context, _ *lifecycle.Progress) error {
		if err := d.slots.runExpiry(ctx, time.Second); ctx.Err() == nil {
			return err
		}
		return ctx.Err()
	})
	return nil
}
