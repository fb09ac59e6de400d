package lifecycle

import "time"

// Snapshot is an immutable copy of a lifecycle's state. Its slices are shared
// between the copies handed out and must not be modified.
type Snapshot struct {
	// Seq increases with every change published, progress reports
	// included; observers can use it to tell whether anything happened in
	// between.
	Seq uint64
	// EventSeq is the Seq of the last [Event] recorded when the snapshot
	// was taken, zero before the first: the snapshot reflects exactly the
	// events up to it, and [Lifecycle.WatchEvents] after it yields the rest.
	EventSeq uint64
	// State is the lifecycle's state, Since when it entered it.
	State State
	Since time.Time
	// History lists every state the lifecycle entered after created, in
	// order, with when: an observer that fell behind still sees each
	// transition.
	History []Transition
	// Started is when Start began; zero before.
	Started time.Time
	// Err is why the lifecycle failed; nil unless State is failed, or
	// stopped after a failure.
	Err error
	// Degraded is true once a background task failed.
	Degraded bool
	// Warnings are the conditions set with [Lifecycle.Warn] and not
	// cleared, in the order they were first set.
	Warnings []Warning
	// Phases lists every phase in declaration order.
	Phases []PhaseSnapshot
	// Tasks lists background tasks in the order they were started.
	Tasks []TaskSnapshot
}

// Transition is the lifecycle entering State at At.
type Transition struct {
	State State
	At    time.Time
}

// PhaseSnapshot is one phase's part of a [Snapshot].
type PhaseSnapshot struct {
	Name      string
	DependsOn []string
	State     PhaseState
	// Attempts is how many times Run was called so far.
	Attempts int
	// Started is when the first attempt began and Ended when the phase
	// reached a final state; zero when that has not happened.
	Started, Ended time.Time
	// Progress is the latest progress of the current or last attempt.
	Progress ProgressSnapshot
	// ETA is the phase's rate and, while it runs, its time left, as of
	// when the snapshot was taken: the one estimate every view shows.
	ETA Estimate
	// Err is the last attempt's error, if it failed.
	Err error
	// WorstCase is the longest the phase can run before it fails for good
	// ([Phase.WorstCase]); for a phase whose policy comes from PolicyFrom,
	// once that gave it. Zero while nothing bounds the phase.
	WorstCase time.Duration
}

// Duration is how long the phase has run: up to Ended once done, up to now
// while it runs, zero before it started.
func (p PhaseSnapshot) Duration() time.Duration {
	return span(p.Started, p.Ended)
}

// TaskSnapshot is one background task's part of a [Snapshot].
type TaskSnapshot struct {
	Name string
	// Phase is the phase that deferred the task.
	Phase          string
	State          TaskState
	Started, Ended time.Time
	Progress       ProgressSnapshot
	// ETA is the task's rate and, while it runs, its time left; see
	// [PhaseSnapshot].
	ETA Estimate
	Err error
}

// Duration is how long the task has run, up to now while it runs.
func (t TaskSnapshot) Duration() time.Duration {
	return span(t.Started, t.Ended)
}

// Phase returns the named phase's snapshot and whether it exists.
func (s Snapshot) Phase(name string) (PhaseSnapshot, bool) {
	for _, p := range s.Phases {
		if p.Name == name {
			return p, true
		}
	}
	return PhaseSnapshot{}, false
}

// Current returns the phases that are running or waiting to retry, in
// declaration order. While starting, health endpoints name these as the
// reason the daemon is not ready.
func (s Snapshot) Current() []PhaseSnapshot {
	var out []PhaseSnapshot
	for _, p := range s.Phases {
		if p.State == PhaseRunning || p.State == PhaseRetrying {
			out = append(out, p)
		}
	}
	return out
}

func span(start, end time.Time) time.Duration {
	switch {
	case start.IsZero():
		return 0
	case end.IsZero():
		return time.Since(start)
	}
	return end.Sub(start)
}
