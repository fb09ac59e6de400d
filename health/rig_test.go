package health_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/phasegate/phasegate/health"
	"github.com/phasegate/phasegate/internal/leakcheck"
	"github.com/phasegate/phasegate/lifecycle"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

// wait is how long a test waits for a condition before it fails. Conditions
// are met in milliseconds; the bound only keeps a broken test from hanging.
const wait = 10 * time.Second

// rig is a lifecycle whose phase reclaim holds startup open at
// 1200/5000 namespaces until the test releases it, and whose phases serve
// and listen hold the drain open in their Stop until the test lets it
// finish (serve's stops first after a start; listen's when a drain cut the
// start short, before serve succeeded). A rig made to fail does not hold
// listen's Stop: the rollback of its start runs it.
//
//	lock ──► listen ──────────► serve
//	   └───► reclaim ─────────┘
type rig struct {
	lc         *lifecycle.Lifecycle
	reclaiming chan struct{} // closed once reclaim reported its progress
	release    chan struct{} // closing it lets reclaim finish
	fail       bool          // reclaim fails when released
	stopping   chan struct{} // closed when the first held Stop runs
	stopDone   chan struct{} // closing it lets the held Stops return
	startErr   chan error
	drainErr   chan error
	once       sync.Once
	stopOnce   sync.Once
}

func newRig(t *testing.T, fail bool) *rig {
	t.Helper()
	r := &rig{
		reclaiming: make(chan struct{}),
		release:    make(chan struct{}),
		fail:       fail,
		stopping:   make(chan struct{}),
		stopDone:   make(chan struct{}),
		startErr:   make(chan error, 1),
		drainErr:   make(chan error, 1),
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
	r.lc = lc
	t.Cleanup(func() { r.shutdown(t) })
	return r
}

// start starts the lifecycle and returns once reclaim is blocked at
// 1200/5000 namespaces.
func (r *rig) start(t *testing.T) {
	t.Helper()
	go func() { r.startErr <- r.lc.Start(context.Background()) }()
	recv(t, r.reclaiming, "reclaim to report progress")
	eventually(t, "phase listen to succeed", func() bool {
		p, _ := r.lc.Snapshot().Phase("listen")
		return p.State == lifecycle.PhaseSucceeded
	})
}

// serve lets startup finish and waits for the outcome.
func (r *rig) serve(t *testing.T) error {
	t.Helper()
	r.once.Do(func() { close(r.release) })
	select {
	case err := <-r.startErr:
		return err
	case <-time.After(wait):
		t.Fatal("startup did not finish")
		return nil
	}
}

// drain starts a drain and returns while it is held in a Stop.
func (r *rig) drain(t *testing.T) {
	t.Helper()
	go func() { r.drainErr <- r.lc.Drain(context.Background()) }()
	recv(t, r.stopping, "the drain to reach serve's Stop")
}

// shutdown releases everything the rig holds and drains the lifecycle.
func (r *rig) shutdown(t *testing.T) {
	r.once.Do(func() { close(r.release) })
	r.finishDrain()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	_ = r.lc.Drain(ctx)
}

// finishDrain lets the held Stops return.
func (r *rig) finishDrain() {
	select {
	case <-r.stopDone:
	default:
		close(r.stopDone)
	}
}

func recv[T any](t *testing.T, c <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-c:
		return v
	case <-time.After(wait):
		t.Fatalf("timed out waiting for %s", what)
	}
	var zero T
	return zero
}

// eventually polls cond until it holds, failing the test after wait. It
// stands for conditions that a goroutine of the code under test makes true
// shortly after an event the test caused.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// grpcHealth serves c's grpc.health.v1 on a loopback port and returns a
// client for it.
func grpcHealth(t *testing.T, c *health.Checker) healthpb.HealthClient {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	c.Register(s)
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = s.Serve(l)
	}()
	conn, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = conn.Close()
		s.Stop()
		<-served
	})
	return healthpb.NewHealthClient(conn)
}
