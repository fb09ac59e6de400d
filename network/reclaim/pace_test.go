package reclaim_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/network/internal/nettest"
	"github.com/phasegate/phasegate/network/reclaim"
	"github.com/phasegate/phasegate/network/slot"
)

// A Pacer quadruples while nothing waits, halves and pauses when a signal is
// over its target (the pause the batch's time, doubling while the pressure
// lasts, within MaxPause), and grows by First once it has slowed down.
func TestPacer(t *testing.T) {
	const ms = time.Millisecond
	type step struct {
		waited    time.Duration // the signal's worst wait since the last batch
		took      time.Duration // the batch's time
		wantSize  int
		wantPause time.Duration
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"nothing waits: quadruples", []step{
			{0, 10 * ms, 256, 0}, {0, 20 * ms, 1024, 0}, {0, 40 * ms, 4096, 0},
		}},
		{"a wait over target: halves and pauses, then grows additively", []step{
			{0, 10 * ms, 256, 0},
			{80 * ms, 30 * ms, 128, 30 * ms},
			{80 * ms, 20 * ms, 64, 60 * ms},
			{80 * ms, 20 * ms, 32, 60 * ms}, // 3 × the batch's 20 ms
			{10 * ms, 5 * ms, 96, 0},
			{0, 5 * ms, 160, 0},
		}},
		{"never below Min, never a pause over MaxPause", []step{
			{time.Second, 400 * ms, 32, 400 * ms},
			{time.Second, 400 * ms, 16, 500 * ms},
			{time.Second, 400 * ms, 16, 500 * ms},
		}},
		{"never a pause over MaxPauseRatio times the batch", []step{
			{time.Second, 40 * ms, 32, 40 * ms},
			{time.Second, 30 * ms, 16, 80 * ms},
			{time.Second, 30 * ms, 16, 90 * ms},
			{time.Second, 10 * ms, 16, 30 * ms},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var waited time.Duration
			p, err := reclaim.NewPacer(reclaim.PaceOptions{
				Signals:       []reclaim.Signal{{Name: "create", Target: 50 * ms, Worst: func() time.Duration { return waited }}},
				First:         64,
				Min:           16,
				MaxPause:      500 * ms,
				MaxPauseRatio: 3,
			})
			if err != nil {
				t.Fatal(err)
			}
			if p.First() != 64 {
				t.Fatalf("First() = %d, want 64", p.First())
			}
			for k, s := range tt.steps {
				waited = s.waited
				size, pause := p.Pace(slot.BatchDone{Slots: 1, Left: 100000, Took: s.took})
				if size != s.wantSize || pause != s.wantPause {
					t.Fatalf("step %d (waited %v): size %d, pause %v; want %d, %v", k, s.waited, size, pause, s.wantSize, s.wantPause)
				}
			}
			st := p.Stats()
			if st.Batches != len(tt.steps) {
				t.Errorf("Stats().Batches = %d, want %d", st.Batches, len(tt.steps))
			}
			over := 0
			for _, s := range tt.steps {
				if s.waited > 50*ms {
					over++
				}
			}
			if st.Slowed != over || st.Over["create"] != over {
				t.Errorf("Stats() = %+v, want %d slowed by create", st, over)
			}
		})
	}
}

// A batch is never asked larger than what is left, and bad options are
// refused.
func TestPacerBounds(t *testing.T) {
	p, err := reclaim.NewPacer(reclaim.PaceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if size, _ := p.Pace(slot.BatchDone{Slots: 64, Left: 100}); size != 100 {
		t.Errorf("size %d with 100 left, want 100", size)
	}
	for _, o := range []reclaim.PaceOptions{
		{First: -1},
		{MaxPause: -time.Second},
		{MaxPauseRatio: -1},
		{Signals: []reclaim.Signal{{Name: "x", Target: time.Second}}},
		{Signals: []reclaim.Signal{{Name: "x", Worst: func() time.Duration { return 0 }}}},
	} {
		if _, err := reclaim.NewPacer(o); err == nil {
			t.Errorf("NewPacer(%+v) accepted", o)
		}
	}
}

// On the kernel, a paced reclaim hands the slots over in the batches the
// pacer asks for, the next unlinked while the kernel destroys the one
// before: with nothing waiting, 8, then 8 again (the size known when the
// first was awaited), 32, then the rest (52); its workers run at the nice
// value asked, the rest of the process as it was.
func TestSlotsPaced(t *testing.T) {
	env := nettest.New(t, 100)
	m := env.Manager(t)
	nettest.Leak(t, m, seq(1, 100))
	p, err := reclaim.NewPacer(reclaim.PaceOptions{First: 8})
	if err != nil {
		t.Fatal(err)
	}
	inv, err := m.Scan(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	own, err := unix.Getpriority(unix.PRIO_PROCESS, 0)
	if err != nil {
		t.Fatal(err)
	}
	var nices []int // of the workers' threads, seen from Progress, which they call
	rep, err := reclaim.Slots(context.Background(), m, inv, reclaim.Options{Pacer: p, Nice: 20 - own + 5,
		Progress: func(int, int) {
			pr, err := unix.Getpriority(unix.PRIO_PROCESS, unix.Gettid())
			if err != nil {
				t.Error(err)
			}
			nices = append(nices, 20-pr)
		}})
	if err != nil {
		t.Fatal(err)
	}
	if len(nices) != 100 || slices.ContainsFunc(nices, func(n int) bool { return n != 20-own+5 }) {
		t.Errorf("workers' nice values %v, want 100 × %d", nices, 20-own+5)
	}
	if pr, err := unix.Getpriority(unix.PRIO_PROCESS, 0); err != nil || pr != own {
		t.Errorf("the process's priority went from %d to %d (%v)", own, pr, err)
	}
	if len(rep.Reclaimed) != 100 || rep.Batches != 4 {
		t.Errorf("reclaimed %d in %d batches, want 100 in 4 (8, 8, 32, 52)", len(rep.Reclaimed), rep.Batches)
	}
	if st := p.Stats(); st.Batches != 2 || st.Largest != 52 {
		t.Errorf("pacer stats %+v, want 2 paces (none once all are started), largest 52 (what was left)", st)
	}
}

// Pace the background reclaim of dead slots by the waits of the rest of
// the process: here, the longest slot creation since the last batch.
func ExamplePacer() {
	var worst time.Duration // kept by whatever creates slots
	p, err := reclaim.NewPacer(reclaim.PaceOptions{Signals: []reclaim.Signal{
		{Name: "create", Target: 50 * time.Millisecond, Worst: func() time.Duration { return worst }},
	}})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(p.First())
	fmt.Println(p.Pace(slot.BatchDone{Slots: 64, Left: 1000, Took: 80 * time.Millisecond}))
	worst = 200 * time.Millisecond
	fmt.Println(p.Pace(slot.BatchDone{Slots: 128, Left: 872, Took: 120 * time.Millisecond}))
	// Output:
	// 64
	// 256 0s
	// 128 120ms
}
