package leases

import (
	"errors"
	"fmt"
	"runtime"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Group commit. Every write becomes an op in a queue. A writer that finds
// no commit under way leads: it yields once (runtime.Gosched), so that the
// writers already runnable queue too, then takes the whole queue, runs
// every op over the records as they stand, appends the group's changes to
// the journal as one entry (fdatasync'd where the store fsyncs), wakes the
// writers it committed for, and goes on with
// whatever queued meanwhile, for up to maxRounds groups; then it
// hands the lead to the first writer still waiting. So a lone writer
// commits at once (bbolt's DB.Batch would first wait out MaxBatchDelay,
// 10 ms by default), and under load the batch grows by itself to whatever
// arrived during the previous commit. Without the yield, a burst of
// Acquires committed little more than one write a commit (each
// handler reached its write after the previous commit had begun; figures:
// docs/BENCHMARKS.md, BenchmarkAcquireOverGRPC). The leader goes
// on rather than handing over after every group because the next
// leader's wake-up is a scheduling delay between two commits on a busy
// machine (docs/BENCHMARKS.md, "Figures behind the network code").

// maxBatch bounds the ops in one group, so that one append's work
// (and the lead's latency) stays bounded however long the queue grows.
const maxBatch = 256

// maxPending bounds the changes the journal holds beyond the file: past
// it the checkpointer checkpoints without waiting for a pause, so that
// memory and the next Open's replay stay bounded under a stream of writes
// that never pauses.
const maxPending = 16384

// checkpointIdle is how long the writes must pause before the
// checkpointer writes the journal's changes into the file: a burst of
// Acquires is never slowed by it. checkpointRetry is its pace after a
// failed checkpoint (a full filesystem): the changes stay in the journal.
const (
	checkpointIdle  = 50 * time.Millisecond
	checkpointRetry = time.Second
)

// maxRounds bounds the groups one leader commits before it passes
// the lead on: going on itself spares the next leader's wake-up (a
// scheduling delay on a busy machine), passing on bounds its own caller's
// wait.
const maxRounds = 4

type op struct {
	// apply makes the op's changes in t. An error wrapped by reject means
	// the op changed nothing and is refused; any other error may have left
	// changes in t's group, which is then run again without the op. nil:
	// the op asks for a checkpoint.
	apply func(t *txn) error
	err   error
	// refused is set while applying when the op was rejected in this
	// attempt of the group.
	refused bool
	// wake receives true when the op's writer must lead, false when err is
	// final.
	wake chan bool
}

// rejected marks an op's refusal that left the group untouched.
type rejected struct{ err error }

func (r rejected) Error() string { return r.err.Error() }
func (r rejected) Unwrap() error { return r.err }

func reject(err error) error { return rejected{err} }

// write queues apply and returns once its outcome is final: committed
// (nil), refused, or failed with its whole group.
func (s *Store) write(apply func(t *txn) error) error {
	o := &op{apply: apply, wake: make(chan bool, 1)}
	s.mu.Lock()
	s.queue = append(s.queue, o)
	if s.leading {
		s.mu.Unlock()
		if lead := <-o.wake; !lead {
			return o.err
		}
		s.mu.Lock()
	}
	s.leading = true
	// Yield once before taking the queue: writers already runnable (the
	// other handlers of a burst, a few microseconds from their own write)
	// run up to it and join this group instead of each waiting for
	// one of their own. With nothing else runnable Gosched returns at once,
	// so a lone writer still commits without a timer.
	s.mu.Unlock()
	runtime.Gosched()
	s.mu.Lock()
	for round := 1; ; round++ {
		n := min(len(s.queue), maxBatch)
		batch := s.queue[:n:n]
		s.queue = s.queue[n:]
		s.mu.Unlock()

		s.commit(batch)
		s.settle(batch)
		for _, b := range batch {
			if b != o {
				b.wake <- false
			}
		}

		s.mu.Lock()
		switch {
		case len(s.queue) == 0:
			s.leading = false
			s.mu.Unlock()
			return o.err
		case round == maxRounds:
			s.queue[0].wake <- true // leading stays true: the lead passes on
			s.mu.Unlock()
			return o.err
		}
	}
}

// commit runs the batch's ops over one view of the records, appends their
// changes to the journal as one entry, and sets every op's err. An op that
// fails after changing the group is taken out, and the group is run again
// without it (ops are pure functions of the records, so running one again
// is safe). A failed append fails every op that was not refused: none of
// their changes is applied.
func (s *Store) commit(batch []*op) {
	var live []*op
	for _, o := range batch {
		if o.apply != nil {
			live = append(live, o)
		}
	}
	for len(live) > 0 {
		failed := -1
		s.txs.Add(1)
		s.group.reset()
		err := s.view(func(tx *bolt.Tx) error {
			t := &txn{tx: tx, pending: s.pending, group: s.group}
			for i, o := range live {
				o.refused = false
				err := s.applyOne(o, t)
				var r rejected
				switch {
				case err == nil:
				case errors.As(err, &r):
					o.err, o.refused = r.err, true
				default:
					failed = i
					return err
				}
			}
			return nil
		})
		if failed >= 0 {
			live[failed].err = err
			live = append(live[:failed:failed], live[failed+1:]...)
			continue
		}
		if err == nil && s.group.len() > 0 {
			err = s.journalGroup()
		}
		for _, o := range live {
			if !o.refused {
				o.err = err
			}
		}
		return
	}
}

// journalGroup appends the group to the journal and makes it pending.
func (s *Store) journalGroup() error {
	if err := s.jnl.append(s.group); err != nil {
		return err
	}
	s.pmu.Lock()
	s.pending.merge(s.group)
	s.pmu.Unlock()
	s.appends.Add(1)
	wake := s.kick
	if s.pending.len() >= maxPending {
		wake = s.full
	}
	select {
	case wake <- struct{}{}:
	default:
	}
	return nil
}

// settle checkpoints after a batch when one of its ops asked for it.
func (s *Store) settle(batch []*op) {
	asked := false
	for _, o := range batch {
		asked = asked || o.apply == nil
	}
	if !asked {
		return
	}
	err := s.checkpoint()
	for _, o := range batch {
		if o.apply == nil {
			o.err = err
		}
	}
}

// checkpoint writes the journal's changes into the file in one bbolt
// transaction (fsynced where the store fsyncs), then empties the journal.
// Only the lead, or Close, calls it. When the commit fails, the changes
// stay pending and in the journal; when only the truncation fails, the
// journal replays changes the file already holds, which is harmless.
func (s *Store) checkpoint() error {
	if s.pending.len() == 0 {
		return nil
	}
	if err := s.update(s.pending.applyTo); err != nil {
		return err
	}
	return s.checkpointed()
}

// checkpointClosed is Close's checkpoint: the journal's changes into the
// file and the file marked closed (meta/closed), in one transaction, so
// that the next Open knows the journal holds nothing the file does not.
// A checkpoint that fails leaves the file not closed: the next Open reads
// the journal.
func (s *Store) checkpointClosed() error {
	if err := s.update(func(tx *bolt.Tx) error {
		if err := s.pending.applyTo(tx); err != nil {
			return err
		}
		return markClosed(tx)
	}); err != nil {
		return err
	}
	if s.pending.len() == 0 {
		return nil
	}
	return s.checkpointed()
}

// checkpointed empties the journal and the pending changes once the file
// holds them, and counts the checkpoint.
func (s *Store) checkpointed() error {
	s.checkpoints.Add(1)
	err := s.jnl.reset()
	s.pmu.Lock()
	s.pending.reset()
	s.pmu.Unlock()
	return err
}

// flush asks the lead for a checkpoint and waits for it.
func (s *Store) flush() error {
	if err := s.enter(); err != nil {
		return err
	}
	defer s.leave()
	return s.write(nil)
}

// checkpointLoop is the store's checkpointer, started by Open and stopped
// by Close: once appends stand still for checkpointIdle, or at once when
// the journal holds maxPending changes, it has the lead checkpoint. (Not
// the lead itself: the writer whose group crossed the bound would wait
// for the checkpoint too.) The first append after a checkpoint wakes it;
// from then on it polls the append count every checkpointIdle instead of
// being woken by every append of a burst. After a failed checkpoint it
// tries again checkpointRetry later, not at every append.
func (s *Store) checkpointLoop() {
	defer close(s.loopDone)
	idle := time.NewTimer(checkpointIdle)
	idle.Stop()
	var (
		kick    = s.kick // nil while idle is armed
		seen    uint64   // the append count when idle was armed
		retryAt time.Time
	)
	arm := func(d time.Duration) {
		kick, seen = nil, s.appends.Load()
		idle.Reset(d)
	}
	flushed := func() bool {
		err := s.flush()
		if err == nil || errors.Is(err, ErrClosed) {
			return true
		}
		retryAt = time.Now().Add(checkpointRetry)
		return false
	}
	for {
		select {
		case <-s.stopLoop:
			idle.Stop()
			return
		case <-kick:
			arm(checkpointIdle)
		case <-s.full:
			if time.Now().Before(retryAt) || flushed() {
				continue
			}
			if kick != nil {
				arm(checkpointRetry)
			}
		case <-idle.C:
			switch {
			case s.appends.Load() != seen:
				arm(checkpointIdle)
			case time.Now().Before(retryAt), !flushed():
				arm(time.Until(retryAt))
			default:
				kick = s.kick
			}
		}
	}
}

// applyOne runs one op, turning a panic (a corrupt page, a bug) into that
// op's error.
func (s *Store) applyOne(o *op, t *txn) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = &CorruptError{Path: s.path, Err: fmt.Errorf("panic while writing: %v", p)}
		}
	}()
	return o.apply(t)
}
