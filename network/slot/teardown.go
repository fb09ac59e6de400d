package slot

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"

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
	Index int
	PID   int
	Comm  string
	// Killed: SIGKILL was sent (KillOrphans).
	Killed bool
	// Gone: with KillOrphans, the process had exited or left the
	// namespace by the time it was to be signalled, and was not.
	Gone bool
	// Err is why it could not be signalled (KillOrphans); the slot was cut
	// off instead.
	Err error
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
	// ProcScan is why the /proc scans for processes inside the namespaces
	// or holding descriptors on them failed or were incomplete (a
	// *netns.IncompleteError names the processes that could not be read);
	// nil when they read everything. Namespaces such processes may hold are
	// treated as possibly held: their host links, if they outlive the wait,
	// are cut off, and nothing is killed on the strength of a failed scan.
	ProcScan error
	// WaitErr is the error that ended a wait for host links early, if
	// any; the links still there were then cut off one by one.
	WaitErr error
	// Batches is how many batches the slots were handed to the kernel in.
	Batches int
	// Timings is where the time went.
	Timings Timings
}

// Timings splits a teardown's wall time into its phases (summed over
// batches).
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
	// Pause is the time spent in BatchPause.
	Pause time.Duration
}

// FailedIndices returns the indices of Failed.
func (r *TeardownResult) FailedIndices() []int {
	out := make([]int, 0, len(r.Failed))
	for _, f := range r.Failed {
		out = append(out, f.Index)
	}
	return out
}

// outcome is what happened to one slot of a teardown.
type outcome struct {
	i       int
	r       Resources // what the slot has, as far as Teardown acts on it
	link    hostLink  // the host link, if it existed when the slot started
	err     error
	orphans []Orphan
	holders []Holder
	cutOff  bool
	wait    bool // host link should vanish with the namespace
	started bool
}

// Teardown removes the slots of inv at kernel speed: it scans /proc once for
// processes inside their namespaces, detaches and unlinks the netns files
// with bounded workers (the kernel then destroys the namespaces and their
// veth pairs in batches), waits with a deadline for the host links to vanish,
// deletes one by one only the host links whose namespace is kept alive (by
// an orphan process, a descriptor, or a file that is already gone), and
// removes the set elements in one nftables transaction. With
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
	m.removeElements(ctx, t.outcomes, t.res)
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
		m: m, ctx: ctx, inv: inv, opts: opts,
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

// runBatches hands the slots to the kernel a batch at a time, each unlinked
// by the workers and then finished (its host links awaited or cut off),
// until all are done or the budget, the halt or ctx defers the rest.
//
// Paced (TeardownOptions.Pace), the next batch is unlinked before this
// one's links are awaited while the pace asks for no pause: the kernel
// destroys the namespaces on one worker, a batch of whatever was unlinked
// when it starts at a time, with a fixed cost per batch (RCU grace
// periods) that the next batch's unlinking then overlaps instead of
// following. Its clean-up always has the next batch queued, as when every
// namespace is unlinked at once, and a batch still bounds how much it
// destroys in one go. A pause is taken with nothing in the kernel.
func (t *teardown) runBatches() {
	total := len(t.indices)
	size, pause := t.batch, t.opts.BatchPause
	cur := t.startBatch(0, size)
	for cur != nil {
		var next *batchSpan
		if t.opts.Pace != nil && pause == 0 && !cur.stopped && (t.opts.Overlap == nil || t.opts.Overlap()) {
			next = t.startBatch(cur.next, size)
		}
		t.finish(cur)
		if cur.stopped {
			return // budget, halt or ctx: the rest is deferred
		}
		started := cur.next
		if next != nil {
			started = next.next
		}
		if t.opts.Pace != nil && started < total {
			size, pause = t.opts.Pace(BatchDone{Slots: cur.next - cur.start, Left: total - started, Took: time.Since(cur.t0)})
			size = max(size, 1)
		}
		if next == nil && cur.next < total {
			t.pause(pause)
			next = t.startBatch(cur.next, size)
		}
		cur = next
	}
}

// batchSpan is one batch of a teardown: the positions in indices it
// started, from start up to next, when, and whether the budget stopped it
// before its end.
type batchSpan struct {
	start, next int
	t0          time.Time
	stopped     bool
}

// startBatch unlinks the batch of size slots from start, nil if there is
// none to start (all started, or the budget, the halt or ctx defers the
// rest).
func (t *teardown) startBatch(start, size int) *batchSpan {
	total := len(t.indices)
	if start >= total || !t.mayStart(start) {
		return nil
	}
	end := min(start+size, total)
	b := &batchSpan{start: start, t0: time.Now()}
	t.unlinkBatch(start, end)
	t.res.Batches++
	b.next, b.stopped = t.position(end)
	return b
}

// finish awaits the host links of batch b (or cuts them off).
func (t *teardown) finish(b *batchSpan) {
	t.m.finishBatch(t.ctx, t.outcomes[b.start:b.next], t.probe, t.opts.HostGoneTimeout, t.res)
}

// pause waits out d between two batches, or less if ctx ends or the
// teardown halts.
func (t *teardown) pause(d time.Duration) {
	if d <= 0 {
		return
	}
	p0 := time.Now()
	tm := time.NewTimer(d)
	select {
	case <-t.ctx.Done():
	case <-t.opts.Halt:
	case <-tm.C:
	}
	tm.Stop()
	t.res.Timings.Pause += time.Since(p0)
}

// unlinkBatch runs the workers over the slots from start up to end, each
// taking the next one while the budget lasts.
func (t *teardown) unlinkBatch(start, end int) {
	t0 := time.Now()
	var wg sync.WaitGroup
	for range min(t.workers, end-start) {
		wg.Go(func() {
			if t.opts.Nice > 0 {
				niceThread(t.opts.Nice)
			}
			for {
				k, ok := t.take(end)
				if !ok {
					return
				}
				t.unlink(k)
			}
		})
	}
	wg.Wait()
	t.res.Timings.Unlink += time.Since(t0)
}

// niceThread locks the calling goroutine to its thread and lowers that
// thread's priority to nice, unless it is already as low: the thread ends
// with the goroutine (runtime.LockOSThread without an unlock), so no other
// goroutine ever runs at that priority (the main thread, which cannot end,
// is parked for good instead: no goroutine runs on it again). If the
// priority cannot be read or set, the goroutine runs on as it was.
func niceThread(nice int) {
	runtime.LockOSThread()
	tid := unix.Gettid()
	// getpriority(2) returns 20 - nice, to keep clear of -1 as an error.
	cur, err := unix.Getpriority(unix.PRIO_PROCESS, tid)
	if err == nil && 20-cur >= nice {
		return
	}
	if err != nil || unix.Setpriority(unix.PRIO_PROCESS, tid, nice) != nil {
		runtime.UnlockOSThread()
	}
}

// unlink tears down the k-th slot down to its host link and reports it.
func (t *teardown) unlink(k int) {
	i := t.indices[k]
	t.outcomes[k] = t.m.unlinkOne(t.ctx, i, t.inv[i], t.probe, t.procs, t.holders, t.self, t.opts.KillOrphans)
	t.report()
}

// take returns the position of the next slot to start before end, if the
// budget lets it start.
func (t *teardown) take(end int) (int, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.next >= end || !t.budgetLeft(t.next) {
		return 0, false
	}
	k := t.next
	t.next++
	return k, true
}

// report calls Progress, serialized.
func (t *teardown) report() {
	if t.opts.Progress == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.done++
	t.opts.Progress(t.done, len(t.indices))
}

// mayStart reports whether the k-th slot may start.
func (t *teardown) mayStart(k int) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.budgetLeft(k)
}

// position returns where the next batch starts, and whether the budget
// stopped this one before end.
func (t *teardown) position(end int) (next int, stopped bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.next, t.next < end
}

// budgetLeft reports whether the k-th slot may start (t.mu held): ctx has
// not ended, the teardown has not halted, and neither the count nor the
// time budget is spent.
func (t *teardown) budgetLeft(k int) bool {
	select {
	case <-t.opts.Halt: // a nil Halt never is
		return false
	default:
	}
	return t.ctx.Err() == nil && (t.opts.MaxSlots <= 0 || k < t.opts.MaxSlots) &&
		(t.opts.Deadline.IsZero() || time.Now().Before(t.opts.Deadline))
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

// unlinkOne does the per-slot part of a teardown: find its host link, deal
// with the processes inside or holding its namespace, detach and unlink its
// netns file, and cut its host link off when nothing will make the kernel
// drop it.
func (m *Manager) unlinkOne(ctx context.Context, i int, r Resources, probe *linkProbe,
	procs, holders netns.Processes, self int, kill bool) outcome {
	o := outcome{i: i, started: true}
	if !m.cfg.HostIfFits(i) {
		r &^= HasHostLink | HasElement // no such link can exist
	}
	o.r = r
	s := m.cfg.Slot(i)
	held := false
	if r&HasHostLink != 0 {
		idx, err := probe.index(s.HostIf)
		if err != nil {
			o.err = err
			return o
		}
		if idx != 0 {
			o.link = hostLink{index: idx, name: s.HostIf}
		}
	}
	if r&HasNetns != 0 {
		// The identity only to match the /proc scans: Delete checks the
		// file is a network namespace before it touches it.
		if id, err := netns.PathID(s.NetnsPath); err == nil {
			o.orphans, o.holders, held = processesOf(i, id, procs, holders, self, kill)
		}
		if err := netns.Delete(ctx, m.cfg.NetnsDir, s.NetnsName); err != nil {
			o.err = err
			return o
		}
	}
	if o.link.index == 0 {
		return o
	}
	if r&HasNetns == 0 || held {
		// Nothing will make the kernel drop this link: cut it off.
		if err := deleteLink(probe, o.link.index, o.link.name); err != nil {
			o.err = err
			return o
		}
		o.cutOff = true
		return o
	}
	o.wait = true
	return o
}

// processesOf names the processes the scans found inside, or holding a
// descriptor on, slot i's namespace id, and with kill sends SIGKILL to
// those inside. held reports whether any of them may keep the namespace
// alive after its file is gone: a holder, or an orphan not killed.
func processesOf(i int, id netns.ID, procs, holders netns.Processes, self int, kill bool) (orphans []Orphan, hs []Holder, held bool) {
	for _, pid := range procs[id] {
		if pid == self {
			// A thread of ours that created the namespace and is still
			// exiting; never signal ourselves.
			continue
		}
		or := Orphan{Index: i, PID: pid, Comm: netns.Comm(pid)}
		if kill {
			or.Killed, or.Err = netns.KillIn(pid, id)
			or.Gone = !or.Killed && or.Err == nil
		}
		if !or.Killed && !or.Gone {
			held = true
		}
		orphans = append(orphans, or)
	}
	for _, pid := range holders[id] {
		if pid == self {
			continue // a descriptor of ours, open for a moment
		}
		held = true
		hs = append(hs, Holder{Index: i, PID: pid, Comm: netns.Comm(pid)})
	}
	return orphans, hs, held
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

// String summarizes a result.
func (r *TeardownResult) String() string {
	return fmt.Sprintf("reclaimed %d, failed %d, deferred %d, orphans %d, cut off %d",
		len(r.Reclaimed), len(r.Failed), len(r.Deferred), len(r.Orphans), len(r.CutOff))
}

// Err joins the failures into one error (nil when there are none). The
// result-wide errors (ProcScan, WaitErr) are not in it: they say what
// Teardown could not see, not what it left behind.
func (r *TeardownResult) Err() error {
	errs := make([]error, 0, len(r.Failed))
	for _, f := range r.Failed {
		errs = append(errs, fmt.Errorf("slot %d: %w", f.Index, f.Err))
	}
	return errors.Join(errs...)
}
