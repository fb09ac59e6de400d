package leases

import (
	"errors"
	"fmt"
	"runtime"

	bolt "go.etcd.io/bbolt"
)

// Group commit. Every write becomes an op in a queue. A writer that finds
// no commit under way leads: it yields once (runtime.Gosched), so that the
// writers already runnable queue too, then takes the whole queue, applies
// every op in one bbolt transaction and commits it (fsynced where the
// store fsyncs), wakes the writers it committed for, and goes on with
// whatever queued meanwhile, for up to maxRounds transactions; then it
// hands the lead to the first writer still waiting. So a lone writer
// commits at once (bbolt's DB.Batch would first wait out MaxBatchDelay,
// 10 ms by default), and under load the batch grows by itself to whatever
// arrived during the previous commit. Without the yield, a burst of
// Acquires committed little more than one write a transaction (each
// handler reached its write after the previous commit had begun; figures:
// docs/BENCHMARKS.md, BenchmarkAcquireOverGRPC). The leader goes
// on rather than handing over after every transaction because the next
// leader's wake-up is a scheduling delay between two commits on a busy
// machine (docs/BENCHMARKS.md, "Figures behind the network code").

// maxBatch bounds the ops in one transaction, so that one commit's work
// (and the lead's latency) stays bounded however long the queue grows.
const maxBatch = 256

// maxRounds bounds the transactions one leader commits before it passes
// the lead on: going on itself spares the next leader's wake-up (a
// scheduling delay on a busy machine), passing on bounds its own caller's
// wait.
const maxRounds = 4

type op struct {
	// apply makes the op's changes in tx. An error wrapped by reject means
	// the op changed nothing and is refused; any other error may have left
	// changes in tx, which must then be rolled back.
	apply func(tx *bolt.Tx) error
	err   error
	// refused is set while applying when the op was rejected in this
	// attempt of the transaction.
	refused bool
	// wake receives true when the op's writer must lead, false when err is
	// final.
	wake chan bool
}

// rejected marks an op's refusal that left the transaction untouched.
type rejected struct{ err error }

func (r rejected) Error() string { return r.err.Error() }
func (r rejected) Unwrap() error { return r.err }

func reject(err error) error { return rejected{err} }

// write queues apply and returns once its outcome is final: committed
// (nil), refused, or failed with its whole transaction.
func (s *Store) write(apply func(tx *bolt.Tx) error) error {
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
	// run up to it and join this transaction instead of each waiting for
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

// commit applies the batch in one transaction and sets every op's err. An
// op that fails after changing the transaction is taken out, and the
// transaction is run again without it (ops are pure functions of the
// store's content, so running one again is safe). A failed commit fails
// every op that was not refused: none of their changes is applied.
func (s *Store) commit(batch []*op) {
	live := batch
	for len(live) > 0 {
		failed := -1
		s.txs.Add(1)
		err := s.update(func(tx *bolt.Tx) error {
			for i, o := range live {
				o.refused = false
				err := s.applyOne(o, tx)
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
		for _, o := range live {
			if !o.refused {
				o.err = err
			}
		}
		return
	}
}

// applyOne runs one op, turning a panic (a corrupt page, a bug) into that
// op's error.
func (s *Store) applyOne(o *op, tx *bolt.Tx) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = &CorruptError{Path: s.path, Err: fmt.Errorf("panic while writing: %v", p)}
		}
	}()
	return o.apply(tx)
}
