package lifecycle_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/phasegate/phasegate/lifecycle"
)

// seqLog records what phases did, ordered by a logical clock rather than
// wall time, so order assertions hold on any machine.
type seqLog struct {
	clock  atomic.Int64
	mu     sync.Mutex
	starts map[string]int64
	ends   map[string]int64
	events []string
}

func newSeqLog() *seqLog {
	return &seqLog{starts: map[string]int64{}, ends: map[string]int64{}}
}

func (l *seqLog) add(event string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, event)
}

func (l *seqLog) list() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.events)
}

// phase returns a Run function that records its start and end around body.
func (l *seqLog) phase(name string, body func(ctx context.Context) error) func(context.Context, *lifecycle.Progress) error {
	return func(ctx context.Context, _ *lifecycle.Progress) error {
		l.mu.Lock()
		l.starts[name] = l.clock.Add(1)
		l.mu.Unlock()
		err := body(ctx)
		l.mu.Lock()
		l.ends[name] = l.clock.Add(1)
		l.mu.Unlock()
		return err
	}
}

// randomDAG declares n phases where each may depend on any earlier one.
func randomDAG(r *rand.Rand, n int, body func(name string) func(context.Context, *lifecycle.Progress) error) []lifecycle.Phase {
	phases := make([]lifecycle.Phase, n)
	for i := range phases {
		name := fmt.Sprintf("p%02d", i)
		var deps []string
		for j := range i {
			if r.IntN(4) == 0 {
				deps = append(deps, fmt.Sprintf("p%02d", j))
			}
		}
		phases[i] = lifecycle.Phase{Name: name, DependsOn: deps, Run: body(name)}
	}
	// Shuffle the declaration so that order and dependency are unrelated.
	r.Shuffle(n, func(i, j int) { phases[i], phases[j] = phases[j], phases[i] })
	return phases
}

func TestDependencyOrderHoldsUnderRandomDelays(t *testing.T) {
	for round := range 60 {
		r := rand.New(rand.NewPCG(uint64(round), 7))
		log := newSeqLog()
		phases := randomDAG(r, 12, func(name string) func(context.Context, *lifecycle.Progress) error {
			d := time.Duration(r.IntN(300)) * time.Microsecond
			return log.phase(name, func(context.Context) error { time.Sleep(d); return nil })
		})
		lc, err := lifecycle.New(phases, lifecycle.WithMaxParallel(r.IntN(4)))
		if err != nil {
			t.Fatal(err)
		}
		if err := lc.Start(context.Background()); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		for _, p := range phases {
			for _, d := range p.DependsOn {
				if log.starts[p.Name] <= log.ends[d] {
					t.Fatalf("round %d: %s started at %d before its dependency %s ended at %d",
						round, p.Name, log.starts[p.Name], d, log.ends[d])
				}
			}
		}
		if got := len(log.ends); got != len(phases) {
			t.Fatalf("round %d: %d phases ran, want %d", round, got, len(phases))
		}
		if err := lc.Drain(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

func TestIndependentPhasesOverlap(t *testing.T) {
	// Each of a and b waits until the other has started: this completes only
	// if they run at the same time.
	aStarted, bStarted := make(chan struct{}), make(chan struct{})
	meet := func(mine, theirs chan struct{}) func(context.Context, *lifecycle.Progress) error {
		return func(ctx context.Context, _ *lifecycle.Progress) error {
			close(mine)
			select {
			case <-theirs:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	lc, err := lifecycle.New([]lifecycle.Phase{
		{Name: "lock", Run: nop},
		{Name: "listen", DependsOn: []string{"lock"}, Run: meet(aStarted, bStarted), Timeout: 10 * time.Second},
		{Name: "reclaim", DependsOn: []string{"lock"}, Run: meet(bStarted, aStarted), Timeout: 10 * time.Second},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := lc.Start(context.Background()); err != nil {
		t.Fatalf("independent phases did not overlap: %v", err)
	}
	_ = lc.Drain(context.Background())
}

func TestMaxParallelAndDeclarationOrder(t *testing.T) {
	for _, limit := range []int{1, 2, 3} {
		t.Run(fmt.Sprint(limit), func(t *testing.T) {
			var running, peak atomic.Int64
			log := newSeqLog()
			var phases []lifecycle.Phase
			for i := range 8 {
				name := fmt.Sprintf("p%d", i)
				phases = append(phases, lifecycle.Phase{Name: name, Run: func(context.Context, *lifecycle.Progress) error {
					log.add(name)
					n := running.Add(1)
					for {
						p := peak.Load()
						if n <= p || peak.CompareAndSwap(p, n) {
							break
						}
					}
					time.Sleep(time.Millisecond)
					running.Add(-1)
					return nil
				}})
			}
			lc, err := lifecycle.New(phases, lifecycle.WithMaxParallel(limit))
			if err != nil {
				t.Fatal(err)
			}
			if err := lc.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			if p := peak.Load(); p > int64(limit) {
				t.Fatalf("%d phases ran at once, limit %d", p, limit)
			}
			if limit == 1 {
				want := []string{"p0", "p1", "p2", "p3", "p4", "p5", "p6", "p7"}
				if got := log.list(); !slices.Equal(got, want) {
					t.Fatalf("start order %v, want declaration order %v", got, want)
				}
			}
		})
	}
}
