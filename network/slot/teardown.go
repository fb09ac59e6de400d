package slot

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/phasegate/phasegate/network/netns"
)

// DefaultWorkers is the default number of concurrent detach+unlink workers.
// Each lazy unmount waits out an RCU grace period after dropping the mount
// lock, so more workers than cores overlap those waits (the measurement
// behind 16 is in docs/BENCHMARKS.md, "Figures behind the network code").
const DefaultWorkers = 16

// TeardownOptions tune Manager.Teardown. The zero value is the default:
// everything at once, DefaultWorkers workers, no budget, no killing.
type TeardownOptions struct {
	// Workers is the number of concurrent detach+unlink workers
	// (default DefaultWorkers).
	Workers int
	// Nice, if above the process's own, is the nice value of the workers'
	// threads: their work is mostly the kernel's (detaching a mount waits
	// for an expedited RCU grace period, a namespace's last reference
	// queues its clean-up), done in their threads, which the scheduler
	// otherwise weighs like those of the process's request handlers. On a
	// busy machine a nice teardown takes the CPU the handlers leave; on an
	// idle one it runs as fast. 0: as the process.
	Nice int
	// MaxSlots is a count budget: at most this many slots are torn down,
	// the rest is deferred. 0 means no limit.
	MaxSlots int
	// Deadline is a time budget: no slot is started after it; the rest is
	// deferred. The zero time means no limit.
	Deadline time.Time
	// Halt, once closed, stops the teardown as a passed Deadline does: no
	// slot is started after it, and the rest is deferred. Unlike
	// cancelling ctx, it lets the slots already started finish: their
	// host links are awaited (or cut off) and their firewall elements
	// removed, so nothing is left half done. Nil never halts.
	Halt <-chan struct{}
	// KillOrphans sends SIGKILL to processes found inside a slot's
	// namespace, each only if it is still inside when it is signalled
	// (netns.KillIn). Without it the processes are left alone and the
	// slot's host link is deleted, cutting them off.
	KillOrphans bool
	// HostGoneTimeout bounds each batch's wait for the kernel to remove
	// the host links after the namespaces are gone (default 10 s plus 5 ms
	// per slot of the batch). Links still there then are deleted one by
	// one.
	HostGoneTimeout time.Duration
	// Batch is how many slots are handed to the kernel at a time: their
	// namespaces are detached and unlinked, and their host links awaited
	// (or cut off) before the next batch starts; the set elements of all
	// go in one transaction at the end. 0 means one batch of everything.
	// The kernel holds the networking lock (RTNL) while it destroys what
	// it was handed, for a time that grows with the batch and with the
	// slots still on the host, so smaller batches shorten the stalls of
	// anything that creates links meanwhile (docs/benchmarks/batches.md).
	Batch int
	// BatchPause is a pause between two batches, for other work to run;
	// 0 means none. A pause that ctx cuts short defers the rest.
	BatchPause time.Duration
	// Pace, when set, is called after each batch with what it did, and
	// returns the size of the next batch and the pause before it, in
	// place of Batch and BatchPause (which still size the first batch):
	// a controller that paces the teardown by what it does to the rest of
	// the process (see package reclaim). A size ≤ 0 means 1. Paced, while
	// the pause asked is 0, the next batch is unlinked before this one's
	// host links are awaited, so the kernel has it queued when it is done
	// with this one; a pause is taken with nothing left in the kernel.
	Pace func(last BatchDone) (next int, pause time.Duration)
	// Overlap, if set, is asked before a paced teardown unlinks the next
	// batch while the kernel still destroys the one before: false makes
	// it await that batch first, as an unpaced teardown does. The overlap
	// keeps the kernel's clean-up busy without a gap, which is what a
	// node where nothing waits wants and what a node answering health
	// checks on two cores cannot spare. nil: always overlap.
	Overlap func() bool
	// TableGoes leaves the slots' set elements and egress chains in the
	// table: the caller deletes the whole table once the teardown is done
	// (a decommission), one transaction that removes them all, where their
	// removal slot by slot would cost a transaction per 128 egress chains.
	// A slot torn down meanwhile keeps its element until the table goes;
	// if the table stays (the teardown failed), the next scan finds the
	// element alone and tears it down then.
	TableGoes bool
	// Progress, if set, is called after each slot's namespace is detached
	// and unlinked (or failed), with the count so far and the total. Calls
	// are serialized.
	Progress func(done, total int)

	// scanProcs replaces the /proc scans (tests).
	scanProcs func() (inside, holders netns.Processes, err error)
}

// BatchDone is what one batch of a teardown did, for TeardownOptions.Pace.
type BatchDone struct {
	// Slots is the number of slots the batch started; Left is the number
	// not started yet.
	Slots, Left int
	// Took is the batch's wall time: unlink, and the wait for the kernel.
	Took time.Duration
}

// Teardown removes the slots of inv at kernel speed: it scans /proc once for
// processes inside their namespaces, detaches and unlinks the netns files
// with bounded workers (the kernel then destroys the namespaces and their
// veth pairs in batches), waits with a deadline for the host links to vanish,
// deletes one by one only the host links whose namespace is kept alive (by
// an orphan process, a descriptor, or a file that is already gone), and
// removes the set elements and egress chains in one nftables transaction
// (the chains beyond the first transaction's share in a few more), or
// leaves them to the table's deletion (TeardownOptions.TableGoes). With
// TeardownOptions.Batch it hands the kernel the namespaces, and awaits
// their links, a batch at a time.
//
// Indices beyond Config.Slots are torn down like the others; one whose host
// link name would not fit IFNAMSIZ has no link nor element to look for.
//
// Slots not started because of the budget or ctx are returned as Deferred.
// Teardown never returns an error of its own: every problem is attached to
// the slot it concerns in Failed, or to the result (ProcScan, WaitErr).
func (m *Manager) Teardown(ctx context.Context, inv Inventory, opts TeardownOptions) *TeardownResult {
	t := m.newTeardown(ctx, inv, opts)
	if len(t.indices) == 0 {
		return t.res
	}
	m.ct.busy(m.inRange(t.indices)...)
	defer func() { m.ct.gone(m.inRange(t.res.Reclaimed)...) }()
	t.scanProcesses()
	probe, err := newLinkProbe()
	if err != nil {
		t.failAll(err)
		return t.res
	}
	defer probe.close()
	t.probe = probe
	t.runBatches()
	// One transaction for all the elements, after the last batch: one per
	// batch costs a listing of the whole set each (nft.Table.Remove lists
	// it to skip missing names), which adds up with small batches (figures:
	// docs/BENCHMARKS.md).
	if !opts.TableGoes {
		m.removeElements(ctx, t.outcomes, t.res)
	}
	t.tally()
	return t.res
}

// teardown is the state of one Manager.Teardown: its inputs, the /proc scans
// and link probe shared by its workers, and each slot's outcome. mu guards
// next and done, which the workers of a batch share.
type teardown struct {
	m       *Manager
	ctx     context.Context
	inv     Inventory
	opts    TeardownOptions
	indices []int
	workers int
	batch   int
	self    int // our pid: never an orphan nor a holder

	procs, holders netns.Processes
	probe          *linkProbe

	mu       sync.Mutex
	next     int // the position in indices of the next slot to start
	done     int // slots unlinked (or failed) so far, for Progress
	outcomes []outcome
	res      *TeardownResult
}

// newTeardown resolves opts' defaults for the slots of inv.
func (m *Manager) newTeardown(ctx context.Context, inv Inventory, opts TeardownOptions) *teardown {
	indices := inv.Indices()
	total := len(indices)
	workers := opts.Workers
	if workers <= 0 {
		workers = DefaultWorkers
	}
	batch := opts.Batch
	if batch <= 0 || batch > total {
		batch = total
	}
	return &teardown{
		m: m, ctx: ctx, inv: maps.Clone(inv), opts: opts, // deleteIfbs marks what it deleted
		indices: indices, workers: workers, batch: batch, self: os.Getpid(),
		outcomes: make([]outcome, total),
		res:      &TeardownResult{},
	}
}

// scanProcesses scans /proc, once, for the processes inside or holding the
// namespaces, if any slot has one.
func (t *teardown) scanProcesses() {
	t0 := time.Now()
	for _, i := range t.indices {
		if t.inv[i]&HasNetns != 0 {
			scan := t.opts.scanProcs
			if scan == nil {
				scan = scanProcs
			}
			t.procs, t.holders, t.res.ProcScan = scan()
			break
		}
	}
	t.res.Timings.Procs = time.Since(t0)
}

// failAll reports every slot failed with err, none having been started.
func (t *teardown) failAll(err error) {
	for _, i := range t.indices {
		t.res.Failed = append(t.res.Failed, Failure{Index: i, Err: err})
	}
}

// tally sorts the outcomes into the result: each started slot reclaimed or
// failed, with its orphans, holders and cut-off link; the others deferred.
func (t *teardown) tally() {
	res := t.res
	for k, o := range t.outcomes {
		if !o.started {
			res.Deferred = append(res.Deferred, t.indices[k])
			continue
		}
		if o.err != nil {
			res.Failed = append(res.Failed, Failure{Index: o.i, Err: o.err})
		} else {
			res.Reclaimed = append(res.Reclaimed, o.i)
		}
		res.Orphans = append(res.Orphans, o.orphans...)
		res.Holders = append(res.Holders, o.holders...)
		if o.cutOff {
			res.CutOff = append(res.CutOff, o.i)
		}
	}
	slices.Sort(res.Deferred)
}

// scanProcs runs both /proc scans.
func scanProcs() (inside, holders netns.Processes, err error) {
	inside, err1 := netns.ScanProcesses()
	holders, err2 := netns.ScanHolders()
	return inside, holders, errors.Join(err1, err2)
}

// finishBatch waits for the kernel to remove the host links of a batch's
// started slots and cuts off those that stay.
func (m *Manager) finishBatch(ctx context.Context, outcomes []outcome, probe *linkProbe, timeout time.Duration, res *TeardownResult) {
	t0 := time.Now()
	var waitFor []hostLink
	for _, o := range outcomes {
		if o.started && o.err == nil && o.wait {
			waitFor = append(waitFor, o.link)
		}
	}
	if timeout <= 0 {
		timeout = 10*time.Second + time.Duration(len(waitFor))*5*time.Millisecond
	}
	stuck := map[int]bool{}
	if len(waitFor) > 0 {
		left, err := awaitLinksGone(ctx, probe, waitFor, time.Now().Add(timeout))
		if err != nil {
			// The links left are cut off below, which is safe.
			res.WaitErr = errors.Join(res.WaitErr, err)
		}
		for _, l := range left {
			stuck[l.index] = true
		}
	}
	// ctx ended (a second signal): the wait is cut short. The namespaces
	// are unlinked and the kernel removes their links on its own; the
	// slots are reported failed (quarantined) rather than cut off one by
	// one, which would take longer than the wait.
	cut := context.Cause(ctx)
	for k := range outcomes {
		o := &outcomes[k]
		if !o.started || o.err != nil || !o.wait || !stuck[o.link.index] {
			continue
		}
		if cut != nil {
			o.err = fmt.Errorf("waiting for the kernel to remove %s: cut short: %w", o.link.name, cut)
			continue
		}
		if err := deleteLink(probe, o.link.index, o.link.name); err != nil {
			o.err = err
			continue
		}
		o.cutOff = true
	}
	res.Timings.Wait += time.Since(t0)
}

// removeElements removes the set elements of the started slots in one
// transaction.
func (m *Manager) removeElements(ctx context.Context, outcomes []outcome, res *TeardownResult) {
	t0 := time.Now()
	var els []string
	for _, o := range outcomes {
		if o.started && o.r&HasElement != 0 {
			els = append(els, m.cfg.HostIfName(o.i))
		}
	}
	if err := m.fw.Remove(context.WithoutCancel(ctx), els...); err != nil {
		for k := range outcomes {
			if o := &outcomes[k]; o.started && o.err == nil && o.r&HasElement != 0 {
				o.err = err
			}
		}
	}
	res.Timings.Firewall += time.Since(t0)
}

// awaitLinksGone waits until every link is gone, the deadline passes or ctx
// ends, and returns the links still there; Destroy awaits one link with it,
// Teardown a batch's. The kernel destroys namespaces in the order their
// last reference went, a batch at a time, so while the first link still
// there stays, the others are not probed: one probe per round instead of
// one per link, since a full sweep of a large batch at every round keeps a
// core busy that the kernel's clean-up worker needs (figures:
// docs/BENCHMARKS.md). At the end, the links left are found with one full
// sweep.
func awaitLinksGone(ctx context.Context, p *linkProbe, links []hostLink, deadline time.Time) ([]hostLink, error) {
	left := links
	delay := time.Millisecond
	for {
		for len(left) > 0 {
			ok, err := p.exists(left[0].index, left[0].name)
			if err != nil {
				return left, err
			}
			if ok {
				break
			}
			left = left[1:]
		}
		if len(left) == 0 {
			return nil, nil
		}
		wait := time.Until(deadline)
		if wait <= 0 || ctx.Err() != nil {
			break
		}
		t := time.NewTimer(min(delay, wait))
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
		delay = min(2*delay, 20*time.Millisecond)
	}
	var still []hostLink
	for _, l := range left {
		ok, err := p.exists(l.index, l.name)
		if err != nil {
			return left, err
		}
		if ok {
			still = append(still, l)
		}
	}
	return still, nil
}
