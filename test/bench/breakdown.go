package main

import (
	"context"
	"fmt"

	"github.com/phasegate/phasegate/network/reclaim"
	"github.com/phasegate/phasegate/network/slot"
)

// Breakdown is where phasegate's reclaim spends its time, measured with the
// library in process (reclaim.Run, the code the daemon's reclaim phase
// runs) on a freshly leaked set: a diagnostic, since the daemon's log only
// gives the total.
type Breakdown struct {
	N          int     `json:"n"`
	TotalMs    float64 `json:"totalMs"`
	ScanMs     float64 `json:"scanMs"`
	ProcsMs    float64 `json:"procsMs"`
	UnlinkMs   float64 `json:"unlinkMs"`
	WaitMs     float64 `json:"waitMs"`
	FirewallMs float64 `json:"firewallMs"`
	CutOff     int     `json:"cutOff"`
}

// breakdownRun leaks n slots and reclaims them in process with the batched
// strategy and the daemon's worker count.
func (r *runner) breakdownRun(ctx context.Context, n int) (Breakdown, error) {
	b := Breakdown{N: n}
	if err := r.leak(ctx, n); err != nil {
		return b, err
	}
	m, err := slot.NewManager(ctx, r.h.cfg, slot.Options{})
	if err != nil {
		return b, fmt.Errorf("breakdown: %w", err)
	}
	rep, err := reclaim.Run(ctx, m, reclaim.Options{Workers: r.o.workers})
	if err != nil {
		return b, fmt.Errorf("breakdown: %w", err)
	}
	if rep.Found != n || len(rep.Reclaimed) != n {
		return b, fmt.Errorf("breakdown: %v", rep)
	}
	b.TotalMs, b.ScanMs = ms(rep.Duration), ms(rep.Scan)
	b.ProcsMs, b.UnlinkMs = ms(rep.Timings.Procs), ms(rep.Timings.Unlink)
	b.WaitMs, b.FirewallMs = ms(rep.Timings.Wait), ms(rep.Timings.Firewall)
	b.CutOff = len(rep.CutOff)
	return b, r.h.settle(ctx, r.o.settle)
}
