package slot

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/phasegate/phasegate/network/netns"
)

// DefaultWorkers is the default number of concurrent detach+unlink workers.
// Each lazy unmount waits out an RCU grace period after dropping the mount
// lock, so more workers than cores overlap those waits (16 halved the
// detach+unlink time of 4 on a 2-core machine).
const DefaultWorkers = 16

// TeardownOptions tune Manager.Teardown. The zero value is the default.
type TeardownOptions struct {
	// Workers is the number of concurrent detach+unlink workers
	// (default DefaultWorkers).
	Workers int
	// MaxSlots is a count budget: at most this many slots are torn down,
	// the rest is deferred. 0 means no limit.
	MaxSlots int
	// Deadline is a time budget: no slot is started after it; the rest is
	// deferred. The zero time means no limit.
	Deadline time.Time
	// KillOrphans sends SIGKILL to processes found inside a slot's
	// namespace. Without it the processes are left alone and the slot's
	// host link is deleted, cutting them off.
	KillOrphans bool
	// HostGoneTimeout bounds the wait for the kernel to remove the host
	// links after the namespaces are gone (default 10 s plus 5 ms per slot).
	// Links still there then are deleted one by one.
	HostGoneTimeout time.Duration
	// Progress, if set, is called after each slot's namespace is detached
	// and unlinked (or failed), with the count so far and the total. Calls
	// are serialized.
	Progress func(done, total int)
}

// Failure is a slot whose teardown failed.
type Failure struct {
	Index int
	Err   error
}

// Holder is a process that held a descriptor on a slot's namespace (without
// living in it) when the slot was torn down. Holders are never killed.
type Holder struct {
	Index int
	PID   int
	Comm  string
}

// Orphan is a process found inside a slot's namespace before it was torn
// down.
type Orphan struct {
	Index  int
	PID    int
	Comm   string
	Killed bool
}

// TeardownResult says what happened to each slot given to Teardown.
type TeardownResult struct {
	// Reclaimed slots are gone: no netns file, no host link, no element.
	Reclaimed []int
	// Failed slots still have something left; their index must stay
	// quarantined.
	Failed []Failure
	// Deferred slots were not started because of the budget or ctx.
	Deferred []int
	// Orphans are the processes found inside torn-down namespaces.
	Orphans []Orphan
	// Holders are the processes that held a descriptor on a torn-down
	// namespace; their slots are cut off without waiting.
	Holders []Holder
	// CutOff slots had their host link deleted explicitly because their
	// namespace outlived its file (a process or descriptor holds it).
	CutOff []int
	// Timings is where the time went.
	Timings Timings
}

// Timings splits a teardown's wall time into its phases.
type Timings struct {
	// Procs is the /proc scan for processes inside the namespaces or
	// holding descriptors on them.
	Procs time.Duration
	// Unlink is the detach+unlink phase (workers).
	Unlink time.Duration
	// Wait is the wait for the kernel to remove the host links, and the
	// deletion of those that stayed.
	Wait time.Duration
	// Firewall is the nftables transaction.
	Firewall time.Duration
}

// FailedIndices returns the indices of Failed.
func (r *TeardownResult) FailedIndices() []int {
	out := make([]int, 0, len(r.Failed))
	for _, f := range r.Failed {
		out = append(out, f.Index)
	}
	return out
}

// Teardown removes the slots of inv at kernel speed: it scans /proc once for
// processes inside their namespaces, detaches and unlinks the netns files
// with bounded workers (the kernel then destroys the namespaces and their
// veth pairs in batches), waits with a deadline for the host links to vanish,
// deletes one by one only the host links whose namespace is kept alive (by
// an orphan process, a descriptor, or a file that is already gone), and
// removes all the set elements in one nftables transaction.
//
// Slots not started because of the budget or ctx are returned as Deferred.
// Teardown never returns an error of its own: every problem is attached to
// the slot it concerns in Failed.
func (m *Manager) Teardown(ctx context.Context, inv Inventory, opts TeardownOptions) *TeardownResult {
	res := &TeardownResult{}
	indices := inv.Indices()
	total := len(indices)
	if total == 0 {
		return res
	}
	workers := opts.Workers
	if workers <= 0 {
		workers = DefaultWorkers
	}
	hostGone := opts.HostGoneTimeout
	if hostGone <= 0 {
		hostGone = 10*time.Second + time.Duration(total)*5*time.Millisecond
	}

	self := os.Getpid()
	t0 := time.Now()
	// Without a scan (an error) every namespace is treated as possibly
	// held: the wait below cuts off what does not vanish.
	var procs, holders netns.Processes
	for _, i := range indices {
		if inv[i]&HasNetns != 0 {
			procs, _ = netns.ScanProcesses()
			holders, _ = netns.ScanHolders()
			break
		}
	}

	res.Timings.Procs = time.Since(t0)
	t0 = time.Now()
	probe, err := newLinkProbe()
	if err != nil {
		for _, i := range indices {
			res.Failed = append(res.Failed, Failure{Index: i, Err: err})
		}
		return res
	}
	defer probe.close()

	type outcome struct {
		i       int
		link    hostLink // the host link, if it existed when the slot started
		err     error
		orphans []Orphan
		holders []Holder
		cutOff  bool
		wait    bool // host link should vanish with the namespace
		started bool
	}
	var (
		mu       sync.Mutex
		next     int
		done     int
		outcomes = make([]outcome, total)
	)
	take := func() (int, bool) {
		mu.Lock()
		defer mu.Unlock()
		if next >= total || ctx.Err() != nil ||
			(opts.MaxSlots > 0 && next >= opts.MaxSlots) ||
			(!opts.Deadline.IsZero() && !time.Now().Before(opts.Deadline)) {
			return 0, false
		}
		k := next
		next++
		return k, true
	}
	report := func() {
		if opts.Progress == nil {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		done++
		opts.Progress(done, total)
	}
	one := func(k int) {
		i := indices[k]
		o := outcome{i: i, started: true}
		defer func() { outcomes[k] = o; report() }()
		s := m.cfg.Slot(i)
		r := inv[i]
		held := false
		if r&HasHostLink != 0 {
			idx, err := probe.index(s.HostIf)
			if err != nil {
				o.err = err
				return
			}
			if idx != 0 {
				o.link = hostLink{index: idx, name: s.HostIf}
			}
		}
		if r&HasNetns != 0 {
			if id, err := netns.Stat(s.NetnsPath); err == nil {
				for _, pid := range procs[id] {
					if pid == self {
						// A thread of ours that created the namespace
						// and is still exiting; never signal ourselves.
						continue
					}
					or := Orphan{Index: i, PID: pid, Comm: netns.Comm(pid)}
					if opts.KillOrphans {
						if killed, err := netns.KillIn(pid, id); err == nil && killed {
							or.Killed = true
						}
					}
					if !or.Killed {
						held = true
					}
					o.orphans = append(o.orphans, or)
				}
				for _, pid := range holders[id] {
					if pid == self {
						continue // a descriptor of ours, open for a moment
					}
					held = true
					o.holders = append(o.holders, Holder{Index: i, PID: pid, Comm: netns.Comm(pid)})
				}
			}
			if err := netns.Delete(ctx, m.cfg.NetnsDir, s.NetnsName); err != nil {
				o.err = err
				return
			}
		}
		if o.link.index == 0 {
			return
		}
		if r&HasNetns == 0 || held {
			// Nothing will make the kernel drop this link: cut it off.
			if err := deleteLink(probe, o.link.index, o.link.name); err != nil {
				o.err = err
				return
			}
			o.cutOff = true
			return
		}
		o.wait = true
	}
	var wg sync.WaitGroup
	for range min(workers, total) {
		wg.Go(func() {
			for {
				k, ok := take()
				if !ok {
					return
				}
				one(k)
			}
		})
	}
	wg.Wait()
	res.Timings.Unlink = time.Since(t0)
	t0 = time.Now()

	// Wait for the kernel to destroy the namespaces and their veth pairs.
	var waitFor []hostLink
	for _, o := range outcomes {
		if o.started && o.err == nil && o.wait {
			waitFor = append(waitFor, o.link)
		}
	}
	stuck := map[int]bool{}
	if len(waitFor) > 0 {
		left, err := waitLinksGone(context.WithoutCancel(ctx), probe, waitFor, time.Now().Add(hostGone))
		_ = err // on a probe error the links left are deleted below, which is safe
		for _, l := range left {
			stuck[l.index] = true
		}
	}
	for k := range outcomes {
		o := &outcomes[k]
		if !o.started || o.err != nil || !o.wait || !stuck[o.link.index] {
			continue
		}
		if err := deleteLink(probe, o.link.index, o.link.name); err != nil {
			o.err = err
			continue
		}
		o.cutOff = true
	}
	res.Timings.Wait = time.Since(t0)
	t0 = time.Now()

	// One transaction for every element of the slots that were started.
	var els []string
	for _, o := range outcomes {
		if o.started && inv[o.i]&HasElement != 0 {
			els = append(els, m.cfg.HostIfName(o.i))
		}
	}
	fwErr := m.fw.Remove(context.WithoutCancel(ctx), els...)
	res.Timings.Firewall = time.Since(t0)

	for _, o := range outcomes {
		switch {
		case !o.started:
			continue
		case o.err != nil:
			res.Failed = append(res.Failed, Failure{Index: o.i, Err: o.err})
		case fwErr != nil && inv[o.i]&HasElement != 0:
			res.Failed = append(res.Failed, Failure{Index: o.i, Err: fwErr})
		default:
			res.Reclaimed = append(res.Reclaimed, o.i)
		}
		res.Orphans = append(res.Orphans, o.orphans...)
		res.Holders = append(res.Holders, o.holders...)
		if o.cutOff {
			res.CutOff = append(res.CutOff, o.i)
		}
	}
	for k, o := range outcomes {
		if !o.started {
			res.Deferred = append(res.Deferred, indices[k])
		}
	}
	slices.Sort(res.Deferred)
	return res
}

// String summarizes a result.
func (r *TeardownResult) String() string {
	return fmt.Sprintf("reclaimed %d, failed %d, deferred %d, orphans %d, cut off %d",
		len(r.Reclaimed), len(r.Failed), len(r.Deferred), len(r.Orphans), len(r.CutOff))
}

// Err joins the failures into one error (nil when there are none).
func (r *TeardownResult) Err() error {
	errs := make([]error, 0, len(r.Failed))
	for _, f := range r.Failed {
		errs = append(errs, fmt.Errorf("slot %d: %w", f.Index, f.Err))
	}
	return errors.Join(errs...)
}
