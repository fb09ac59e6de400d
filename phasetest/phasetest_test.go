package phasetest_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/phasegate/phasegate/internal/leakcheck"
	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/phasetest"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

// spyTB stands in for a test whose failures are themselves under test. It
// embeds the real one for the methods it does not replace.
type spyTB struct {
	testing.TB
	mu       sync.Mutex
	errors   []string
	fatal    string
	logs     []string
	cleanups []func()
}

func newSpy(t *testing.T) *spyTB { return &spyTB{TB: t} }

func (s *spyTB) Helper() {}

func (s *spyTB) Errorf(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.errors = append(s.errors, fmt.Sprintf(format, args...))
}

func (s *spyTB) Fatalf(format string, args ...any) {
	s.mu.Lock()
	s.fatal = fmt.Sprintf(format, args...)
	s.mu.Unlock()
	runtime.Goexit() // as testing does: the rest of the test does not run
}

func (s *spyTB) Logf(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.logs = append(s.logs, fmt.Sprintf(format, args...))
}

func (s *spyTB) Failed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.errors) > 0 || s.fatal != ""
}

func (s *spyTB) Cleanup(f func()) { s.cleanups = append(s.cleanups, f) }

// run runs f on a goroutine of its own, as testing runs a test, so that
// Fatalf can end it, then runs the cleanups it registered.
func (s *spyTB) run(f func(t testing.TB)) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(s)
	}()
	<-done
	for i := len(s.cleanups) - 1; i >= 0; i-- {
		s.cleanups[i]()
	}
}

func nop(context.Context, *lifecycle.Progress) error { return nil }

func ev(seq uint64, kind lifecycle.EventKind, name, from, to string, deps ...string) lifecycle.Event {
	e := lifecycle.Event{Seq: seq, Kind: kind, Name: name, From: lifecycle.EventStateOf(kind, from), To: lifecycle.EventStateOf(kind, to), DependsOn: deps}
	if kind == lifecycle.EventPhase {
		e.Attempt = 1
	}
	return e
}

// goodLog is lock, then listen and reclaim side by side, then serve.
func goodLog() []lifecycle.Event {
	L, P := lifecycle.EventLifecycle, lifecycle.EventPhase
	return []lifecycle.Event{
		ev(1, L, "", "created", "starting"),
		ev(2, P, "lock", "pending", "running"),
		ev(3, P, "lock", "running", "succeeded"),
		ev(4, P, "reclaim", "pending", "running", "lock"),
		ev(5, P, "listen", "pending", "running", "lock"),
		ev(6, P, "listen", "running", "succeeded", "lock"),
		ev(7, P, "reclaim", "running", "succeeded", "lock"),
		ev(8, P, "serve", "pending", "running", "listen", "reclaim"),
		ev(9, P, "serve", "running", "succeeded", "listen", "reclaim"),
		ev(10, L, "", "starting", "serving"),
	}
}

// timedLog is goodLog with times: lock takes 10ms, reclaim 3s.
func timedLog() []lifecycle.Event {
	l := goodLog()
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	at := map[uint64]time.Duration{
		1: 0, 2: 0, 3: 10 * time.Millisecond, 4: 10 * time.Millisecond, 5: 11 * time.Millisecond,
		6: 20 * time.Millisecond, 7: 3010 * time.Millisecond, 8: 3011 * time.Millisecond,
		9: 3012 * time.Millisecond, 10: 3012 * time.Millisecond,
	}
	for i := range l {
		l[i].Time = t0.Add(at[l[i].Seq])
	}
	return l
}

// assertionCase is an assertion of a log, and the substrings of its
// failure (none: it passes).
type assertionCase struct {
	name   string
	log    func() []lifecycle.Event
	assert func(t testing.TB, log []lifecycle.Event) bool
	want   []string
}

func TestAssertions(t *testing.T) {
	for _, tc := range slices.Concat(consistencyCases(), orderCases(), overlapCases(), durationCases(), dependencyCases()) {
		t.Run(tc.name, func(t *testing.T) { checkAssertion(t, tc) })
	}
}

// checkAssertion runs tc's assertion on a spy and checks that it passes,
// or fails saying each of tc.want.
func checkAssertion(t *testing.T, tc assertionCase) {
	spy := newSpy(t)
	var ok bool
	spy.run(func(tb testing.TB) { ok = tc.assert(tb, tc.log()) })
	if ok != (len(tc.want) == 0) || ok != (len(spy.errors) == 0) {
		t.Fatalf("returned %v with errors %q", ok, spy.errors)
	}
	for _, w := range tc.want {
		if !strings.Contains(strings.Join(spy.errors, "\n"), w) {
			t.Errorf("failure does not say %q:\n%s", w, strings.Join(spy.errors, "\n"))
		}
	}
}

// drop is log without the event numbered seq.
func drop(log []lifecycle.Event, seq uint64) []lifecycle.Event {
	var out []lifecycle.Event
	for _, e := range log {
		if e.Seq != seq {
			out = append(out, e)
		}
	}
	return out
}

// consistencyCases are AssertConsistent's: a whole log, and one with a
// transition lost, repeated or impossible.
func consistencyCases() []assertionCase {
	return []assertionCase{
		{
			name:   "a whole log is consistent",
			log:    goodLog,
			assert: phasetest.AssertConsistent,
		},
		{
			name:   "a lost transition breaks the chain and the numbering",
			log:    func() []lifecycle.Event { return drop(goodLog(), 6) },
			assert: phasetest.AssertConsistent,
			want:   []string{"the event log is not consistent", "#7 phase reclaim running→succeeded (attempt 1): event 6 is missing"},
		},
		{
			name: "a repeated transition",
			log: func() []lifecycle.Event {
				l := goodLog()
				return append(l[:4:4], append([]lifecycle.Event{l[3]}, l[4:]...)...)
			},
			assert: phasetest.AssertConsistent,
			want:   []string{"event 4 is repeated or out of order (want 5)", "phase reclaim leaves pending but was running"},
		},
		{
			name: "a transition the engine cannot take",
			log: func() []lifecycle.Event {
				l := goodLog()
				l[9].From, l[9].To = lifecycle.StateStarting, lifecycle.StateStopped
				return l
			},
			assert: phasetest.AssertConsistent,
			want:   []string{"starting→stopped is not a lifecycle transition"},
		},
	}
}

// orderCases are AssertOrder's: phases in order, overlapping, or one that
// never ran.
func orderCases() []assertionCase {
	return []assertionCase{
		{
			name: "phases in order",
			log:  goodLog,
			assert: func(t testing.TB, l []lifecycle.Event) bool {
				return phasetest.AssertOrder(t, l, "lock", "reclaim", "serve")
			},
		},
		{
			name: "phases that overlapped are not in order",
			log:  goodLog,
			assert: func(t testing.TB, l []lifecycle.Event) bool {
				return phasetest.AssertOrder(t, l, "lock", "reclaim", "listen")
			},
			want: []string{"phase listen started (event 5) before reclaim succeeded (event 7)"},
		},
		{
			name: "a phase that never ran",
			log:  goodLog,
			assert: func(t testing.TB, l []lifecycle.Event) bool {
				return phasetest.AssertOrder(t, l, "lock", "register")
			},
			want: []string{"phase register never started: it has no event", "#10 lifecycle starting→serving"},
		},
	}
}

// overlapCases are AssertOverlap's: phases side by side, one after the
// other, one still running, one never started.
func overlapCases() []assertionCase {
	return []assertionCase{
		{
			name: "phases side by side overlap",
			log:  goodLog,
			assert: func(t testing.TB, l []lifecycle.Event) bool {
				return phasetest.AssertOverlap(t, l, "reclaim", "listen")
			},
		},
		{
			name: "phases one after the other do not overlap",
			log:  goodLog,
			assert: func(t testing.TB, l []lifecycle.Event) bool {
				return phasetest.AssertOverlap(t, l, "serve", "lock")
			},
			want: []string{"phases serve and lock did not overlap", "phase lock ended (event 3) before serve started (event 8)"},
		},
		{
			name: "a phase still running overlaps one started after it",
			log:  func() []lifecycle.Event { return goodLog()[:5] },
			assert: func(t testing.TB, l []lifecycle.Event) bool {
				return phasetest.AssertOverlap(t, l, "listen", "reclaim")
			},
		},
		{
			name: "a phase that never started overlaps nothing",
			log:  goodLog,
			assert: func(t testing.TB, l []lifecycle.Event) bool {
				return phasetest.AssertOverlap(t, l, "reclaim", "register")
			},
			want: []string{"phase register never started: it has no event"},
		},
	}
}

// durationCases are AssertTookAtMost's and AssertTookAtLeast's.
func durationCases() []assertionCase {
	return []assertionCase{
		{
			name: "a phase within its bound",
			log:  timedLog,
			assert: func(t testing.TB, l []lifecycle.Event) bool {
				return phasetest.AssertTookAtMost(t, l, "reclaim", 3*time.Second) &&
					phasetest.AssertTookAtLeast(t, l, "reclaim", 3*time.Second)
			},
		},
		{
			name: "a phase that took too long",
			log:  timedLog,
			assert: func(t testing.TB, l []lifecycle.Event) bool {
				return phasetest.AssertTookAtMost(t, l, "reclaim", time.Second)
			},
			want: []string{"phase reclaim took 3s, more than 1s"},
		},
		{
			name: "a phase that was too quick",
			log:  timedLog,
			assert: func(t testing.TB, l []lifecycle.Event) bool {
				return phasetest.AssertTookAtLeast(t, l, "lock", time.Second)
			},
			want: []string{"phase lock took 10ms, less than 1s"},
		},
		{
			name: "a phase that has not ended has no duration",
			log:  func() []lifecycle.Event { return timedLog()[:5] },
			assert: func(t testing.TB, l []lifecycle.Event) bool {
				return phasetest.AssertTookAtMost(t, l, "reclaim", time.Hour)
			},
			want: []string{"phase reclaim has not ended: it is running"},
		},
	}
}

// dependencyCases are AssertRespectsDependencies'.
func dependencyCases() []assertionCase {
	return []assertionCase{
		{
			name:   "dependencies respected",
			log:    goodLog,
			assert: phasetest.AssertRespectsDependencies,
		},
		{
			name: "a phase that started before its dependency succeeded",
			log: func() []lifecycle.Event {
				l := goodLog()
				l[7].Seq, l[6].Seq = 7, 8 // serve starts before reclaim succeeded
				l[6], l[7] = l[7], l[6]
				return l
			},
			assert: phasetest.AssertRespectsDependencies,
			want:   []string{"phase serve started attempt 1 (event 7) before its dependency reclaim succeeded"},
		},
	}
}

func TestWaitsFailWithWhatHappenedInstead(t *testing.T) {
	failing := []lifecycle.Phase{
		{Name: "lock", Run: nop},
		{Name: "reclaim", DependsOn: []string{"lock"}, Run: func(context.Context, *lifecycle.Progress) error {
			return lifecycle.Permanent(errors.New("unmount: EBUSY"))
		}},
		{Name: "serve", DependsOn: []string{"reclaim"}, Run: nop},
	}
	tests := []struct {
		name string
		wait func(t testing.TB, lc *lifecycle.Lifecycle)
		want []string
	}{
		{
			name: "serving after a failed start",
			wait: func(t testing.TB, lc *lifecycle.Lifecycle) {
				phasetest.WaitState(t, lc, lifecycle.StateServing, time.Minute)
			},
			want: []string{
				"waiting for the lifecycle to enter serving: it is failed and can no longer enter serving",
				`lifecycle created→starting→failed (phase "reclaim" failed after 1 attempt: unmount: EBUSY); phases: lock succeeded, reclaim failed [unmount: EBUSY], serve skipped`,
			},
		},
		{
			name: "a phase that was skipped",
			wait: func(t testing.TB, lc *lifecycle.Lifecycle) {
				phasetest.WaitPhase(t, lc, "serve", lifecycle.PhaseSucceeded, time.Minute)
			},
			want: []string{"waiting for phase serve to enter succeeded: phase serve ended skipped"},
		},
		{
			name: "a phase that does not exist, until the deadline",
			wait: func(t testing.TB, lc *lifecycle.Lifecycle) {
				phasetest.WaitPhase(t, lc, "register", lifecycle.PhaseRunning, 50*time.Millisecond)
			},
			want: []string{"waiting for phase register to enter running: not within 50ms", "#7 lifecycle starting→failed"},
		},
		{
			name: "created",
			wait: func(t testing.TB, lc *lifecycle.Lifecycle) {
				phasetest.WaitState(t, lc, lifecycle.StateCreated, time.Minute)
			},
			want: []string{"a lifecycle begins in created and never enters it"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			lc, err := lifecycle.New(failing)
			if err != nil {
				t.Fatal(err)
			}
			_ = lc.Start(context.Background())
			spy := newSpy(t)
			spy.run(func(tb testing.TB) { tc.wait(tb, lc) })
			for _, w := range tc.want {
				if !strings.Contains(spy.fatal, w) {
					t.Errorf("failure does not say %q:\n%s", w, spy.fatal)
				}
			}
			_ = lc.Drain(context.Background())
		})
	}
	t.Run("a state already passed is found", func(t *testing.T) {
		h := phasetest.New(t, []lifecycle.Phase{{Name: "lock", Run: nop}}).RequireStart()
		h.RequireStop()
		if e := phasetest.WaitState(t, h, lifecycle.StateServing, time.Minute); e.To != lifecycle.StateServing {
			t.Fatalf("returned %v", e)
		}
		if e := phasetest.WaitPhase(t, h, "lock", lifecycle.PhaseRunning, time.Minute); e.Attempt != 1 {
			t.Fatalf("returned %v", e)
		}
	})
}

func TestHarness(t *testing.T) {
	t.Run("a hung start fails naming what runs, and the cleanup stops it", func(t *testing.T) {
		var stopped, cancelled bool
		spy := newSpy(t)
		var h *phasetest.Harness
		spy.run(func(tb testing.TB) {
			h = phasetest.New(tb, []lifecycle.Phase{
				{Name: "lock", Run: nop, Stop: func(context.Context) error { stopped = true; return nil }},
				{Name: "reclaim", DependsOn: []string{"lock"}, Run: func(ctx context.Context, p *lifecycle.Progress) error {
					p.SetTotal(10, "namespaces")
					p.Add(3)
					<-ctx.Done()
					cancelled = true
					return ctx.Err()
				}},
			})
			h.Timeout = 50 * time.Millisecond
			h.RequireStart()
			t.Error("RequireStart returned after a failed start")
		})
		for _, w := range []string{
			"phasetest: start failed: lifecycle: start cancelled: phasetest: start did not end within 50ms: still running: reclaim running for ",
			" at 3/10 namespaces",
			"#3 phase lock running→succeeded",
		} {
			if !strings.Contains(spy.fatal, w) {
				t.Errorf("failure does not say %q:\n%s", w, spy.fatal)
			}
		}
		if !stopped || !cancelled || h.State() != lifecycle.StateStopped {
			t.Fatalf("after cleanup: lock stopped %v, reclaim cancelled %v, state %s", stopped, cancelled, h.State())
		}
		if len(spy.logs) != 1 || !strings.Contains(spy.logs[0], "#7 lifecycle failed→stopped") {
			t.Fatalf("a failed test's cleanup logged %q, want the event log", spy.logs)
		}
	})
	t.Run("a test that forgets to stop still stops", func(t *testing.T) {
		spy := newSpy(t)
		var h *phasetest.Harness
		spy.run(func(tb testing.TB) {
			h = phasetest.New(tb, []lifecycle.Phase{{Name: "lock", Run: nop}}).RequireStart()
		})
		if h.State() != lifecycle.StateStopped || spy.Failed() || len(spy.logs) != 0 {
			t.Fatalf("state %s, errors %q, logs %q", h.State(), spy.errors, spy.logs)
		}
	})
	t.Run("a failing stop fails RequireStop", func(t *testing.T) {
		spy := newSpy(t)
		spy.run(func(tb testing.TB) {
			h := phasetest.New(tb, []lifecycle.Phase{{Name: "listen", Run: nop,
				Stop: func(context.Context) error { return errors.New("port still bound") }}}).RequireStart()
			h.RequireStop()
		})
		if !strings.Contains(spy.fatal, `phasetest: stop failed: phase "listen": stop: port still bound`) {
			t.Fatalf("failure %q", spy.fatal)
		}
	})
	t.Run("an invalid declaration fails at once", func(t *testing.T) {
		spy := newSpy(t)
		spy.run(func(tb testing.TB) {
			phasetest.New(tb, []lifecycle.Phase{{Name: "a", DependsOn: []string{"b"}, Run: nop}})
		})
		if !strings.Contains(spy.fatal, `phasetest: lifecycle.New: phase "a" depends on unknown phase "b"`) {
			t.Fatalf("failure %q", spy.fatal)
		}
	})
}

func TestRecorderNotesEventsOutOfSequence(t *testing.T) {
	var r phasetest.Recorder
	log := goodLog()
	r.Record(log[0])
	r.Record(log[2])
	if err := r.Err(); err == nil || err.Error() != "phasetest: recorded event 3 where 2 was due" {
		t.Fatalf("Err = %v", err)
	}
	if got := r.Events(0); len(got) != 2 {
		t.Fatalf("Events = %v", got)
	}
}

// WaitSnapshot finds a condition that already holds, one that comes later
// (a warning raised after the wait began), and fails with the last
// snapshot when the condition never comes.
func TestWaitSnapshot(t *testing.T) {
	h := phasetest.New(t, []lifecycle.Phase{{Name: "lock", Run: nop}}).RequireStart()
	lc := h.Lifecycle
	serving := func(s lifecycle.Snapshot) bool { return s.State == lifecycle.StateServing }
	if s := phasetest.WaitSnapshot(t, lc, "serving", time.Minute, serving); s.State != lifecycle.StateServing {
		t.Fatalf("returned %v", s)
	}
	go func() {
		time.Sleep(20 * time.Millisecond)
		lc.Warn("queue", "queue unreachable")
	}()
	warned := phasetest.WaitSnapshot(t, lc, "the warning", time.Minute, func(s lifecycle.Snapshot) bool { return len(s.Warnings) > 0 })
	if len(warned.Warnings) != 1 || warned.Warnings[0].Name != "queue" {
		t.Fatalf("returned warnings %v", warned.Warnings)
	}
	spy := newSpy(t)
	spy.run(func(tb testing.TB) {
		phasetest.WaitSnapshot(tb, lc, "a drain", 50*time.Millisecond, func(s lifecycle.Snapshot) bool { return s.State == lifecycle.StateDraining })
	})
	if !strings.Contains(spy.fatal, "no a drain within 50ms; last snapshot:") {
		t.Errorf("failure does not say what it waited for: %s", spy.fatal)
	}
}

// A start in the background is watched while it runs, and a stop during
// it ends the start and waits for it: the channel has the start's error.
func TestStartInBackground(t *testing.T) {
	h := phasetest.New(t, []lifecycle.Phase{
		{Name: "lock", Run: nop},
		{Name: "migrate", DependsOn: []string{"lock"}, Run: func(ctx context.Context, _ *lifecycle.Progress) error {
			<-ctx.Done()
			return ctx.Err()
		}},
	})
	done := h.StartInBackground()
	phasetest.WaitPhase(t, h, "migrate", lifecycle.PhaseRunning, time.Minute)
	h.RequireStop()
	select {
	case err, ok := <-done:
		if !ok || err == nil {
			t.Errorf("the start drained while migrate ran: %v (received %v), want its error", err, ok)
		}
	default:
		t.Error("RequireStop returned before the start it ended")
	}
	phasetest.AssertConsistent(t, h.Events(0))
	if st := h.Snapshot().State; st == lifecycle.StateServing {
		t.Errorf("state %v after a drain during the start", st)
	}
}
