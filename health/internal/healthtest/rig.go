package healthtest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/phasegate/phasegate/lifecycle"
)

// Wait is how long a test waits for a condition before it fails. Conditions
// are met in milliseconds; the bound only keeps a broken test from hanging.
const Wait = 10 * time.Second

// Rig is a lifecycle whose phase reclaim holds startup open at
// 1200/5000 namespaces until the test releases it, and whose phases serve
// and listen hold the drain open in their Stop until the test lets it
// finish (serve's stops first after a start; listen's when a drain cut the
// start short, before serve succeeded). A rig made to fail does not hold
// listen's Stop: the rollback of its start runs it.
//
//	lock ──► listen ──────────► serve
//	   └───► reclaim ─────────┘
type Rig struct {
	LC         *lifecycle.Lifecycle // the lifecycle under test
	reclaiming chan struct{}        // closed once reclaim reported its progress
	release    chan struct{}        // closing it lets reclaim finish
	fail       bool                 // reclaim fails when released
	stopping   chan struct{}        // closed when the first held Stop runs
	stopDone   chan struct{}        // closing it lets the held Stops return
	StartErr   chan error           // what Start returned, once it did
	DrainErr   chan error           // what Drain returned, once it did
	once       sync.Once
	stopOnce   sync.Once
}

// NewRig builds a rig, whose reclaim fails when released if fail is set,
// and drains it when the test ends.
func NewRig(t *testing.T, fail bool) *Rig {
	t.Helper()
	r := &Rig{
		reclaiming: make(chan struct{}),
		release:    make(chan struct{}),
		fail:       fail,
		stopping:   make(chan struct{}),
		stopDone:   make(chan struct{}),
		StartErr:   make(chan error, 1),
		DrainErr:   make(chan error, 1),
	}
	noop := func(context.Context, *lifecycle.Progress) error { return nil }
	hold := func(ctx context.Context) error {
		r.stopOnce.Do(func() { close(r.stopping) })
		select {
		case <-r.stopDone:
		case <-ctx.Done():
		}
		return nil
	}
	listenStop := hold
	if fail {
		listenStop = nil // the rollback of a failed start is not held
	}
	lc, err := lifecycle.New([]lifecycle.Phase{
		{Name: "lock", Run: noop},
		{Name: "listen", DependsOn: []string{"lock"}, Run: noop, Stop: listenStop},
		{Name: "reclaim", DependsOn: []string{"lock"}, Run: func(ctx context.Context, p *lifecycle.Progress) error {
			p.SetTotal(5000, "namespaces")
			p.SetDone(1200)
			close(r.reclaiming)
			select {
			case <-r.release:
			case <-ctx.Done():
				return ctx.Err()
			}
			if r.fail {
				return lifecycle.Permanent(errors.New("netns dir unreadable"))
			}
			p.SetDone(5000)
			return nil
		}},
		{Name: "serve", DependsOn: []string{"listen", "reclaim"}, Run: noop, Stop: hold},
	}, lifecycle.WithProgressInterval(time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	r.LC = lc
	t.Cleanup(func() { r.shutdown(t) })
	return r
}

// Start starts the lifecycle and returns once reclaim is blocked at
// 1200/5000 namespaces.
func (r *Rig) Start(t *testing.T) {
	t.Helper()
	go func() { r.StartErr <- r.LC.Start(context.Background()) }()
	Recv(t, r.reclaiming, "reclaim to report progress")
	Eventually(t, "phase listen to succeed", func() bool {
		p, _ := r.LC.Snapshot().Phase("listen")
		return p.State == lifecycle.PhaseSucceeded
	})
}

// Serve lets startup finish and waits for the outcome.
func (r *Rig) Serve(t *testing.T) error {
	t.Helper()
	r.once.Do(func() { close(r.release) })
	select {
	case err := <-r.StartErr:
		return err
	case <-time.After(Wait):
		t.Fatal("startup did not finish")
		return nil
	}
}

// Drain starts a drain and returns while it is held in a Stop.
func (r *Rig) Drain(t *testing.T) {
	t.Helper()
	go func() { r.DrainErr <- r.LC.Drain(context.Background()) }()
	Recv(t, r.stopping, "the drain to reach serve's Stop")
}

// shutdown releases everything the rig holds and drains the lifecycle.
func (r *Rig) shutdown(t *testing.T) {
	r.once.Do(func() { close(r.release) })
	r.FinishDrain()
	ctx, cancel := context.WithTimeout(context.Background(), Wait)
	defer cancel()
	_ = r.LC.Drain(ctx)
}

// FinishDrain lets the held Stops return.
func (r *Rig) FinishDrain() {
	select {
	case <-r.stopDone:
	default:
		close(r.stopDone)
	}
}

// Recv receives from c, failing the test after Wait.
func Recv[T any](t *testing.T, c <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-c:
		return v
	case <-time.After(Wait):
		t.Fatalf("timed out waiting for %s", what)
	}
	var zero T
	return zero
}

// Eventually polls cond until it holds, failing the test after wait. It
// stands for conditions that a goroutine of the code under test makes true
// shortly after an event the test caused.
func Eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(Wait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}
