package lifecycle_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/phasegate/phasegate/lifecycle"
)

func TestFailureCancelsSkipsAndRollsBack(t *testing.T) {
	log := newSeqLog()
	stop := func(name string) func(context.Context) error {
		return func(context.Context) error { log.add("stop " + name); return nil }
	}
	bStarted := make(chan struct{})
	phases := []lifecycle.Phase{
		{Name: "lock", Run: nop, Stop: stop("lock")},
		{Name: "listen", DependsOn: []string{"lock"}, Run: nop, Stop: stop("listen")},
		{Name: "reclaim", DependsOn: []string{"lock"}, Stop: stop("reclaim"), Run: func(ctx context.Context, _ *lifecycle.Progress) error {
			close(bStarted)
			<-ctx.Done() // a long reclaim, cancelled by the sibling's failure
			log.add("reclaim cancelled: " + context.Cause(ctx).Error())
			return ctx.Err()
		}},
		{Name: "register", DependsOn: []string{"listen"}, Stop: stop("register"), Run: func(ctx context.Context, _ *lifecycle.Progress) error {
			<-bStarted
			return lifecycle.Permanent(errors.New("bad certificate"))
		}},
		{Name: "populate", DependsOn: []string{"reclaim"}, Run: nop, Stop: stop("populate")},
		{Name: "serve", DependsOn: []string{"register", "populate"}, Run: nop, Stop: stop("serve")},
	}
	lc, err := lifecycle.New(phases)
	if err != nil {
		t.Fatal(err)
	}
	err = lc.Start(context.Background())
	var pe *lifecycle.PhaseError
	if !errors.As(err, &pe) || pe.Phase != "register" || err.Error() != `phase "register" failed after 1 attempt: bad certificate` {
		t.Fatalf("err = %v", err)
	}
	s := lc.Snapshot()
	want := map[string]lifecycle.PhaseState{
		"lock": lifecycle.PhaseSucceeded, "listen": lifecycle.PhaseSucceeded,
		"reclaim": lifecycle.PhaseCancelled, "register": lifecycle.PhaseFailed,
		"populate": lifecycle.PhaseSkipped, "serve": lifecycle.PhaseSkipped,
	}
	for _, p := range s.Phases {
		if p.State != want[p.Name] {
			t.Errorf("phase %s is %s, want %s", p.Name, p.State, want[p.Name])
		}
	}
	if s.State != lifecycle.StateFailed || s.Err == nil {
		t.Fatalf("lifecycle %s (err %v), want failed", s.State, s.Err)
	}
	wantLog := []string{
		`reclaim cancelled: phase "register" failed after 1 attempt: bad certificate`,
		"stop listen",
		"stop lock",
	}
	if got := log.list(); !slices.Equal(got, wantLog) {
		t.Fatalf("log %q, want %q", got, wantLog)
	}
	// Draining a failed lifecycle stops it without running any stop twice.
	if err := lc.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	if lc.State() != lifecycle.StateStopped || len(log.list()) != len(wantLog) {
		t.Fatalf("after drain: %s, log %q", lc.State(), log.list())
	}
}

func TestRollbackOrderIsReverseDependencyOrder(t *testing.T) {
	for round := range 30 {
		r := rand.New(rand.NewPCG(uint64(round), 11))
		log := newSeqLog()
		var phases []lifecycle.Phase
		phases = randomDAG(r, 10, func(name string) func(context.Context, *lifecycle.Progress) error {
			d := time.Duration(r.IntN(200)) * time.Microsecond
			return func(context.Context, *lifecycle.Progress) error { time.Sleep(d); return nil }
		})
		stopped := map[string]int{}
		for i := range phases {
			name := phases[i].Name
			phases[i].Stop = func(context.Context) error {
				log.mu.Lock()
				stopped[name] = len(stopped)
				log.mu.Unlock()
				return nil
			}
		}
		lc, err := lifecycle.New(phases)
		if err != nil {
			t.Fatal(err)
		}
		if err := lc.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := lc.Drain(context.Background()); err != nil {
			t.Fatal(err)
		}
		for _, p := range phases {
			for _, d := range p.DependsOn {
				if stopped[p.Name] >= stopped[d] {
					t.Fatalf("round %d: %s (depends on %s) stopped after it", round, p.Name, d)
				}
			}
		}
	}
}

func TestStartHonoursContext(t *testing.T) {
	started := make(chan struct{})
	var stopped atomic.Bool
	lc, err := lifecycle.New([]lifecycle.Phase{
		{Name: "lock", Run: nop, Stop: func(context.Context) error { stopped.Store(true); return nil }},
		{Name: "reclaim", DependsOn: []string{"lock"}, Run: func(ctx context.Context, _ *lifecycle.Progress) error {
			close(started)
			<-ctx.Done()
			return ctx.Err()
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-started; cancel() }()
	err = lc.Start(ctx)
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "start cancelled") {
		t.Fatalf("err = %v, want start cancelled", err)
	}
	if lc.State() != lifecycle.StateFailed || !stopped.Load() {
		t.Fatalf("state %s, lock stopped %v; want failed and rolled back", lc.State(), stopped.Load())
	}
	p, _ := lc.Snapshot().Phase("reclaim")
	if p.State != lifecycle.PhaseCancelled {
		t.Fatalf("reclaim %s, want cancelled", p.State)
	}
}

func TestPanicInRunIsAnError(t *testing.T) {
	lc, err := lifecycle.New([]lifecycle.Phase{{Name: "lock", Run: func(context.Context, *lifecycle.Progress) error {
		panic("boom")
	}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := lc.Start(context.Background()); err == nil || err.Error() != `phase "lock" failed after 1 attempt: panic: boom` {
		t.Fatalf("err = %v", err)
	}
}

func TestFailFromServing(t *testing.T) {
	var stopped atomic.Bool
	lc, err := lifecycle.New([]lifecycle.Phase{{Name: "lock", Run: nop, Stop: func(context.Context) error { stopped.Store(true); return nil }}})
	if err != nil {
		t.Fatal(err)
	}
	if err := lc.Fail(errors.New("x")); err == nil {
		t.Fatal("Fail from created was accepted")
	}
	if err := lc.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := lc.Fail(errors.New("reconciler died")); err != nil {
		t.Fatal(err)
	}
	if s := lc.Snapshot(); s.State != lifecycle.StateFailed || s.Err.Error() != "reconciler died" {
		t.Fatalf("state %s err %v", s.State, s.Err)
	}
	if err := lc.Drain(context.Background()); err != nil || !stopped.Load() || lc.State() != lifecycle.StateStopped {
		t.Fatalf("drain %v stopped %v state %s", err, stopped.Load(), lc.State())
	}
}
