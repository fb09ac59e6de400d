package eventlog

import "context"

// Wake is the channel the readers of a log wait on for its next change.
// The zero value is ready; the log's lock guards it.
type Wake struct{ ch chan struct{} }

// Next returns a channel closed at the next [Wake.Signal].
func (w *Wake) Next() <-chan struct{} {
	if w.ch == nil {
		w.ch = make(chan struct{})
	}
	return w.ch
}

// Signal wakes every reader waiting for the next change. It makes no
// channel while nobody waits.
func (w *Wake) Signal() {
	if w.ch != nil {
		close(w.ch)
		w.ch = nil
	}
}

// Since is what a reader at position after is due of log: the events from
// there on, sharing log's array but capped, so that an append never writes
// into the batch; or, with none, the channel closed at the next change; or
// ended, when none will come.
func Since[E any](log []E, after uint64, ended bool, w *Wake) (batch []E, wake <-chan struct{}, done bool) {
	if n := uint64(len(log)); after < n {
		return log[after:n:n], nil, false
	}
	if ended {
		return nil, nil, true
	}
	return nil, w.Next(), false
}

// Follow sends, on the channel it returns, each event since gives from
// position after on, waiting on the wake-ups it gives, until since says
// the log ended or ctx ends; then it closes the channel. Its goroutine
// ends with it.
func Follow[E any](ctx context.Context, after uint64, since func(after uint64) (batch []E, wake <-chan struct{}, done bool)) <-chan E {
	ch := make(chan E)
	go func() {
		defer close(ch)
		for {
			batch, wake, done := since(after)
			for _, e := range batch {
				select {
				case ch <- e:
					after++
				case <-ctx.Done():
					return
				}
			}
			switch {
			case len(batch) > 0:
				continue
			case done:
				return
			}
			select {
			case <-wake:
			case <-ctx.Done():
				return
			}
		}
	}()
	return ch
}
