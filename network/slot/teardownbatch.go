package slot

import (
	"maps"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/phasegate/phasegate/network/shape"
	"golang.org/x/sys/unix"
)

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
	t.deleteIfbs(start, end)
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

// deleteIfbs deletes the ifbs of the slots from start up to end that have
// one in a single deletion (shape.DeleteIfbs), before the workers unlink
// them: alone, each ifb would cost the kernel's RCU grace periods with
// the rtnl lock held, tens of milliseconds, one after another. A slot
// whose ifb did not go keeps HasShaper, so its worker tries again and
// fails the slot as before. Should the budget defer a slot of the batch
// after this, its ifb is gone already, which a slot being torn down does
// not miss.
func (t *teardown) deleteIfbs(start, end int) {
	byName := map[string]int{}
	for _, i := range t.indices[start:end] {
		if t.inv[i]&HasShaper != 0 {
			byName[t.m.cfg.ShaperIfName(i)] = i
		}
	}
	if len(byName) == 0 {
		return
	}
	failed := shape.DeleteIfbs(slices.Collect(maps.Keys(byName)))
	for name, i := range byName {
		if failed[name] == nil {
			t.inv[i] &^= HasShaper
		}
	}
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
