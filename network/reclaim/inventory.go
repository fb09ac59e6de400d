package reclaim

import (
	"context"
	"fmt"
	"time"

	"github.com/phasegate/phasegate/network/slot"
)

// Slots tears down the slots of inv, which the caller found and decided
// are leaked (a daemon that matched the host with its records), and
// reports what happened like [Run]; Report.Scan, Beyond and Unreadable
// are the caller's, since inv came from the caller's survey.
// Options.Budget counts from the call.
func Slots(ctx context.Context, m *slot.Manager, inv slot.Inventory, opts Options) (*Report, error) {
	start := time.Now()
	rep := &Report{Slots: m.Config().Slots, Found: len(inv)}
	defer func() { rep.Duration = time.Since(start) }()
	var deadline time.Time
	if opts.Budget > 0 {
		deadline = start.Add(opts.Budget)
	}
	to := slot.TeardownOptions{
		Workers: opts.Workers, Nice: opts.Nice, MaxSlots: opts.MaxSlots, Deadline: deadline,
		KillOrphans: opts.KillOrphans, HostGoneTimeout: opts.HostGoneTimeout, Progress: opts.Progress,
		Batch: opts.Batch, BatchPause: opts.BatchPause, Halt: opts.Halt,
	}
	if opts.Pacer != nil {
		to.Batch, to.BatchPause, to.Pace, to.Overlap = opts.Pacer.First(), 0, opts.Pacer.Pace, opts.Pacer.Idle
	}
	res := m.Teardown(ctx, inv, to)
	rep.Reclaimed, rep.Failed, rep.Deferred = res.Reclaimed, res.Failed, res.Deferred
	rep.Orphans, rep.Holders, rep.CutOff, rep.Timings = res.Orphans, res.Holders, res.CutOff, res.Timings
	rep.ProcScan, rep.WaitErr, rep.Batches = res.ProcScan, res.WaitErr, res.Batches
	if err := ctx.Err(); err != nil && len(rep.Deferred) > 0 {
		return rep, fmt.Errorf("reclaim: %d slot(s) deferred: %w", len(rep.Deferred), err)
	}
	return rep, nil
}
