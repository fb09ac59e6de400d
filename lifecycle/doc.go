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
// Both machines are github.com/looplab/fsm instances; no other transition can
// happen.
//
// Everything the engine knows is observable: [Lifecycle.Snapshot] returns an
// immutable copy, and [Lifecycle.Subscribe] delivers every change to an
// observer that keeps up and the latest state to one that does not, without
// ever blocking the runner. Health endpoints, progress views and tests are all
// built on these two calls.
//
// The package knows nothing of gRPC, HTTP or network namespaces. Tracing goes
// through the OpenTelemetry API: a root span "startup", a child span per phase,
// a "drain" span with a child per stop function, and background tasks as spans
// linked to the phase that deferred them.
package lifecycle
