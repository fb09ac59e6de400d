package phasetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/phasegate/phasegate/lifecycle"
)

// WaitState waits until the lifecycle behind src has entered state — now
// or at any time before: the wait replays the log from its first event, so
// it cannot miss a state the lifecycle passed through quickly — and returns
// the event that entered it. It fails the test with t.Fatalf, saying where
// the lifecycle and each phase got to instead, when timeout passes first,
// when the lifecycle can no longer enter state (it failed and a test waits
// for serving), when the log ends without it, or when the log is not
// consistent (see [AssertConsistent]). created is never entered (it is where
// a lifecycle begins), so waiting for it is an error.
func WaitState(t testing.TB, src Source, state lifecycle.State, timeout time.Duration) lifecycle.Event {
	t.Helper()
	if state == lifecycle.StateCreated {
		t.Fatalf("phasetest: WaitState(%s): a lifecycle begins in created and never enters it", state)
	}
	what := fmt.Sprintf("the lifecycle to enter %s", state)
	return wait(t, src, what, timeout, func(m *model, e lifecycle.Event) (bool, string) {
		switch {
		case e.Kind == lifecycle.EventLifecycle && e.To == state:
			return true, ""
		case !reachable(m.state, state):
			return false, fmt.Sprintf("it is %s and can no longer enter %s", m.state, state)
		}
		return false, ""
	})
}

// WaitPhase waits until the named phase has entered state, now or before,
// and returns the event that entered it. Like [WaitState] it fails the test
// with what was seen instead when timeout passes first, when the phase has
// ended in another state, or when the log ends or breaks; waiting for
// pending, where every phase begins, is an error.
func WaitPhase(t testing.TB, src Source, name string, state lifecycle.PhaseState, timeout time.Duration) lifecycle.Event {
	t.Helper()
	if state == lifecycle.PhasePending {
		t.Fatalf("phasetest: WaitPhase(%s, %s): a phase begins pending and never enters it", name, state)
	}
	what := fmt.Sprintf("phase %s to enter %s", name, state)
	return wait(t, src, what, timeout, func(m *model, e lifecycle.Event) (bool, string) {
		if e.Kind == lifecycle.EventPhase && e.Name == name && e.To == state {
			return true, ""
		}
		if p := m.phases[name]; p != nil && p.state.Done() {
			return false, fmt.Sprintf("phase %s ended %s", name, p.state)
		}
		return false, ""
	})
}

// wait replays src's log through a model until match says it is found or
// impossible, the log ends or breaks, or timeout passes.
func wait(t testing.TB, src Source, what string, timeout time.Duration, match func(*model, lifecycle.Event) (bool, string)) lifecycle.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	m := newModel()
	var log []lifecycle.Event
	for e := range src.WatchEvents(ctx, 0) {
		log = append(log, e)
		if err := m.apply(e); err != nil {
			t.Fatalf("phasetest: waiting for %s: the event log is not consistent: %v\n%s\n%s", what, err, m.summary(), formatLog(log))
		}
		found, never := match(m, e)
		if found {
			return e
		}
		if never != "" {
			t.Fatalf("phasetest: waiting for %s: %s\n%s\n%s", what, never, m.summary(), formatLog(log))
		}
	}
	why := "the event log ended"
	switch {
	case ctx.Err() != nil:
		why = fmt.Sprintf("not within %s", timeout)
	case m.final:
		why = "the lifecycle stopped"
	}
	if r, ok := src.(interface{ recording() *Recorder }); ok {
		rec := r.recording()
		if err := rec.Err(); err != nil {
			why += "; the recording broke: " + err.Error()
		}
		rec.mu.Lock()
		if rec.reason != "" {
			why += "; " + rec.reason
		}
		rec.mu.Unlock()
	}
	t.Fatalf("phasetest: waiting for %s: %s\n%s\n%s", what, why, m.summary(), formatLog(log))
	return lifecycle.Event{}
}

// WaitSnapshot waits until a snapshot of lc satisfies ok — a warning
// raised or cleared, a task's progress, anything the event log does not
// say in so many words — and returns it. Snapshots are the latest-wins
// kind (see [lifecycle.Lifecycle.Subscribe]): a condition that holds only
// between two of them can be missed, so ok should describe a state that
// lasts. It fails the test with the last snapshot when timeout passes
// first; what names the condition in that message.
func WaitSnapshot(t testing.TB, lc *lifecycle.Lifecycle, what string, timeout time.Duration, ok func(lifecycle.Snapshot) bool) lifecycle.Snapshot {
	t.Helper()
	ch, stop := lc.Subscribe()
	defer stop()
	if s := lc.Snapshot(); ok(s) {
		return s
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		select {
		case s := <-ch:
			if ok(s) {
				return s
			}
		case <-deadline.C:
			t.Fatalf("phasetest: no %s within %s; last snapshot: %v", what, timeout, lc.Snapshot())
			return lifecycle.Snapshot{}
		}
	}
}
