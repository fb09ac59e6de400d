package reclaim

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/phasegate/phasegate/network/slot"
)

// Options tune Run. The zero value reclaims everything with default
// workers.
type Options struct {
	// Workers bounds concurrent detach+unlink calls (default
	// slot.DefaultWorkers).
	Workers int
	// Nice lowers the workers' CPU priority (see slot.TeardownOptions).
	Nice int
	// Budget is a time budget: no slot is started after it has elapsed
	// since Run began; the remainder is deferred. 0 means none.
	Budget time.Duration
	// MaxSlots is a count budget: at most this many slots are torn down;
	// the remainder is deferred. 0 means none.
	MaxSlots int
	// Halt, once closed, starts no more slots and defers the rest, but
	// finishes those started (see slot.TeardownOptions); cancelling ctx
	// cuts their waits short too. The error is nil after a halt.
	Halt <-chan struct{}
	// KillOrphans ends (SIGKILL) processes found inside leaked namespaces.
	// Without it they are reported and cut off (their host veth deleted).
	KillOrphans bool
	// HostGoneTimeout bounds the wait for host links to vanish (see
	// slot.TeardownOptions).
	HostGoneTimeout time.Duration
	// Batch and BatchPause hand the kernel the dead namespaces a batch at
	// a time (see slot.TeardownOptions). Zero: all at once, no pause.
	Batch      int
	BatchPause time.Duration
	// Pacer, when set, sizes the batches and the pauses between them by
	// what they do to the rest of the process, in place of Batch and
	// BatchPause (see Pacer).
	Pacer *Pacer
	// Progress, if set, is called after each slot with the count so far
	// and the number found. Calls are serialized.
	Progress func(done, total int)
}

// Report says what Run found and did.
type Report struct {
	// Slots is the configuration's number of slots: Quarantine covers
	// [1, Slots].
	Slots int
	// Found is the number of leaked slots found, beyond Slots included.
	Found int
	// Beyond are the found indices greater than Slots, ascending: a run
	// with a larger Config.Slots left them. They are torn down and counted in
	// Reclaimed, Failed or Deferred like the others, but never quarantined
	// (the allocator does not cover them): the reconciler sweeps those
	// left.
	Beyond []int
	// Unreadable are the netns entries at our names that could not be
	// inspected: never torn down; those in [1, Slots] are quarantined.
	Unreadable []slot.Unreadable
	// Reclaimed slots are completely gone; their indices are free.
	Reclaimed []int
	// Failed slots still have something left, with the reason.
	Failed []slot.Failure
	// Deferred slots were not started (budget or ctx); quarantine them.
	Deferred []int
	// Orphans are processes found inside leaked namespaces.
	Orphans []slot.Orphan
	// Holders are processes that held a descriptor on a leaked namespace
	// (never killed; their slots are cut off).
	Holders []slot.Holder
	// CutOff slots had their host veth deleted because their namespace
	// outlived its file.
	CutOff []int
	// ProcScan is why the /proc scan for processes inside the leaked
	// namespaces failed or was incomplete (see
	// slot.TeardownResult.ProcScan); nil when it read everything.
	ProcScan error
	// WaitErr ended a wait for host links early (see
	// slot.TeardownResult.WaitErr).
	WaitErr error
	// Batches is how many batches the slots were handed to the kernel in.
	Batches int
	// Duration is the wall time of Run, scan included.
	Duration time.Duration
	// Scan is the time spent listing what exists; Timings splits the rest.
	Scan    time.Duration
	Timings slot.Timings
}

// Quarantine returns the indices in [1, Slots] the allocator must
// quarantine, ascending: failed and deferred slots, and unreadable entries.
func (r *Report) Quarantine() []int {
	var out []int
	add := func(i int) {
		if i >= 1 && i <= r.Slots {
			out = append(out, i)
		}
	}
	for _, i := range r.Deferred {
		add(i)
	}
	for _, f := range r.Failed {
		add(f.Index)
	}
	for _, u := range r.Unreadable {
		add(u.Index)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// String summarizes the report in one line.
func (r *Report) String() string {
	return fmt.Sprintf("reclaim: found %d (beyond slots %d), reclaimed %d, failed %d, deferred %d, unreadable %d, orphans %d, holders %d, cut off %d in %v"+
		" (scan %v, procs %v, unlink %v, wait %v, firewall %v, %d batch(es))",
		r.Found, len(r.Beyond), len(r.Reclaimed), len(r.Failed), len(r.Deferred), len(r.Unreadable), len(r.Orphans), len(r.Holders), len(r.CutOff),
		r.Duration.Round(time.Millisecond), r.Scan.Round(time.Millisecond), r.Timings.Procs.Round(time.Millisecond),
		r.Timings.Unlink.Round(time.Millisecond), r.Timings.Wait.Round(time.Millisecond), r.Timings.Firewall.Round(time.Millisecond), r.Batches)
}

// Run scans the host for slots leaked under m's configuration (indices
// beyond Slots included) and tears them down. It always returns a report;
// the error is non-nil when the scan failed (nothing was touched) or ctx
// ended before everything was started (the rest is in Report.Deferred).
// What Run could not read or do is in the report, not in the error:
// Unreadable, Failed, ProcScan, WaitErr.
func Run(ctx context.Context, m *slot.Manager, opts Options) (*Report, error) {
	start := time.Now()
	sr, err := m.Survey(ctx)
	if err != nil {
		rep := &Report{Slots: m.Config().Slots, Duration: time.Since(start)}
		return rep, fmt.Errorf("reclaim: scan: %w", err)
	}
	rep, err := Slots(ctx, m, sr.Inventory, opts)
	rep.Beyond, rep.Unreadable = sr.Beyond, sr.Unreadable
	rep.Scan = time.Since(start) - rep.Duration
	rep.Duration = time.Since(start)
	return rep, err
}
