package lifecycle

import "time"

// watcher is one observer's 1-slot mailbox. Only the lifecycle sends, always
// under its mutex, so replacing a pending value never blocks.
type watcher struct {
	ch chan Snapshot
}

func (w *watcher) offer(s Snapshot) {
	select {
	case w.ch <- s:
	default:
		// The observer has not taken the previous value: it gets the newest
		// one instead of a stale one, and the runner never waits for it.
		select {
		case <-w.ch:
		default:
		}
		w.ch <- s
	}
}

// Subscribe returns a channel that holds the lifecycle's latest snapshot: the
// current one at once, then a new one after every change, progress reports
// included. It is latest-wins, like grpc-go's health Watch: a new snapshot
// replaces one the observer has not taken yet, so the runner never waits for
// an observer, and an observer always reads the present state soon after it
// changes — but it may miss intermediate states however fast it reads,
// since the lifecycle can change several times between two receives. That is
// what a health check or a progress view wants. To see every transition
// exactly once and in order, use [Lifecycle.WatchEvents] or
// [WithEventHook] instead.
//
// The channel is never closed by the lifecycle; cancel stops the delivery and
// closes it. cancel is idempotent.
func (l *Lifecycle) Subscribe() (<-chan Snapshot, func()) {
	w := &watcher{ch: make(chan Snapshot, 1)}
	l.mu.Lock()
	if l.watchers == nil {
		l.watchers = make(map[*watcher]struct{})
	}
	l.watchers[w] = struct{}{}
	l.hasWatchers.Store(true)
	w.offer(l.snapshotLocked())
	l.mu.Unlock()
	return w.ch, func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if _, ok := l.watchers[w]; !ok {
			return
		}
		delete(l.watchers, w)
		l.hasWatchers.Store(len(l.watchers) > 0)
		close(w.ch)
	}
}

// Seq returns the Seq of the last change published, without the lock
// that [Lifecycle.Snapshot] takes: an observer that holds something made
// from a snapshot of that Seq can tell it is still current (state,
// phases, tasks and warnings as they are; progress as of when it was
// taken) without taking a new one.
func (l *Lifecycle) Seq() uint64 { return l.seq.Load() }

// Snapshot returns a copy of the lifecycle's current state.
func (l *Lifecycle) Snapshot() Snapshot {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.snapshotLocked()
}

func (l *Lifecycle) snapshotLocked() Snapshot {
	s := Snapshot{
		Seq:      l.seq.Load(),
		EventSeq: uint64(len(l.events)),
		State:    State(l.fsm.Current()),
		Since:    l.since,
		History:  l.history[:len(l.history):len(l.history)],
		Started:  l.started,
		Err:      l.err,
		Degraded: l.degraded,
		Warnings: l.warnings,
		Phases:   make([]PhaseSnapshot, len(l.phases)),
	}
	for i, r := range l.phases {
		s.Phases[i] = PhaseSnapshot{
			Name:      r.Name,
			DependsOn: r.DependsOn,
			State:     PhaseState(r.fsm.Current()),
			Attempts:  r.attempts,
			Started:   r.started,
			Ended:     r.ended,
			Progress:  r.progress.snapshot(),
			Err:       r.err,
			WorstCase: r.worstCase,
		}
	}
	if len(l.tasks) > 0 {
		s.Tasks = make([]TaskSnapshot, len(l.tasks))
		for i, t := range l.tasks {
			s.Tasks[i] = TaskSnapshot{
				Name:     t.name,
				Phase:    t.phase,
				State:    t.state,
				Started:  t.started,
				Ended:    t.ended,
				Progress: t.progress.snapshot(),
				Err:      t.err,
			}
		}
	}
	// Under the mutex, so the estimator's observations come in time order.
	l.eta.observe(&s, time.Now())
	return s
}

// publishLocked records a change and hands the new snapshot to every
// observer. Without observers it only counts.
func (l *Lifecycle) publishLocked() {
	l.seq.Add(1)
	if len(l.watchers) == 0 {
		return
	}
	s := l.snapshotLocked()
	for w := range l.watchers {
		w.offer(s)
	}
}

// progressChanged publishes progress at most once per progress interval,
// with a trailing publish so the last report of a burst is never lost.
// It is called for every Progress update, so the common paths take no lock.
func (l *Lifecycle) progressChanged() {
	if !l.hasWatchers.Load() || l.progressPending.Load() {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.progressPending.Load() {
		return
	}
	wait := l.opts.progressInterval - time.Since(l.lastProgress)
	if wait <= 0 {
		l.lastProgress = time.Now()
		l.publishLocked()
		return
	}
	l.progressPending.Store(true)
	if l.progressTmr == nil {
		l.progressTmr = time.AfterFunc(wait, l.flushProgress)
	} else {
		l.progressTmr.Reset(wait)
	}
}

func (l *Lifecycle) flushProgress() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.progressPending.Store(false)
	l.lastProgress = time.Now()
	l.publishLocked()
}
