// Package lifecycle runs a daemon's startup as a declared graph of phases.
//
// A [Phase] names the phases it depends on; [New] checks the whole set as a
// directed acyclic graph and reports every problem at once. [Lifecycle.Start]
// runs the phases through a state machine: a phase starts as soon as all its
// dependencies succeeded, independent phases run concurrently, each attempt has
// its own timeout and failed attempts are retried with exponential backoff.
// When a phase fails for good, running siblings are cancelled, phases not yet
// started are skipped and the stop functions of the phases that had succeeded
// run in reverse dependency order.
//
// Exactly what runs after a failure (a phase failing for good, the start
// timing out, a drain during the start, or Start's ctx ending):
//
//   - no phase begins, not even one that was ready at the same moment as
//     the failing one: in the event log, no phase turns running after the
//     event of the failure (the phase turning failed, the lifecycle turning
//     draining) nor after the start timeout passed; such a phase ends
//     skipped, with no span;
//   - a phase already running, or waiting to retry, is cancelled: its ctx
//     ends with the failure as the cause, and the start waits for its Run
//     to return; it ends cancelled (or succeeded, if Run returns nil
//     regardless, in which case its Stop runs with the others');
//   - the Stop of every phase that succeeded runs once, in reverse
//     completion order; the background tasks those phases deferred are
//     cancelled;
//   - nothing else: no Stop of a phase that failed, was cancelled or never
//     began.
//
// The lifecycle moves through
//
//	created → starting → serving → draining → stopped
//	          starting → draining              (a drain during the start)
//	          starting → failed → stopped
//	                     serving → failed      (a fatal fault, see [Lifecycle.Fail])
//
// and each phase through
//
//	pending → running → succeeded | failed | cancelled
//	          running → retrying → running
//	pending → skipped
//
// Both machines are github.com/looplab/fsm instances, built from the one
// table of the package's transitions in state.go, which [Transitions]
// returns (with the background tasks' machine beside them); no other
// transition can happen.
//
// Everything the engine knows is observable, in two ways that answer two
// different questions:
//
//   - What is the state now? [Lifecycle.Snapshot] returns an immutable copy,
//     and [Lifecycle.Subscribe] hands an observer the latest snapshot after
//     each change, latest-wins: it never blocks the runner and may skip
//     intermediate states. Health endpoints and progress views are built on
//     these.
//   - What happened, in which order? Every transition of the lifecycle, of a
//     phase, of a background task and of a warning is recorded once as an
//     [Event] with a dense sequence number, in a log kept for the lifecycle's
//     life. [Lifecycle.Events] reads it, [Lifecycle.WatchEvents] follows it
//     without ever dropping an event, and [WithEventHook] hands each event
//     to a function, in order, exactly once. Tests that assert phase order
//     and operators who want the whole story use these; the eventstream
//     package serves them over HTTP and the phasetest package asserts on
//     them.
//
// A program that serves until a signal or until it can no longer serve
// selects on [Lifecycle.Done]; [Lifecycle.Err] says why it failed, if it did.
//
// Panics in Run, Stop and background tasks are recovered as a [*PanicError]
// carrying the stack. [WithStartTimeout] bounds a whole start and names the
// phases that were still running when it passed.
//
// The package knows nothing of gRPC, HTTP or network namespaces. Tracing goes
// through the OpenTelemetry API: a root span "startup", a child span per phase,
// a "drain" span with a child per stop function, and background tasks as spans
// linked to the phase that deferred them.
package lifecycle
