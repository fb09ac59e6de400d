// Package phasetest helps test programs whose startup is a
// [lifecycle.Lifecycle].
//
// It gives start and stop tied to the test, a recorder of events, assertions
// on the order phases ran in, and waits with deadlines and failure messages
// that say what happened instead. The same assertions and waits work in
// process and against a running process's port, through its event stream
// (package eventstream). Every helper takes a testing.TB, so benchmarks can
// use them too.
//
// In process, a phase-order assertion on a service's *app.App (newApp
// stands for the service's own constructor):
//
//	func TestStartupOrder(t *testing.T) {
//		a, err := newApp(app.DefaultConfig("runner", "127.0.0.1:0"))
//		if err != nil {
//			t.Fatal(err)
//		}
//		h := phasetest.Wrap(t, a).RequireStart()
//		phasetest.AssertOrder(t, h.Events(0), "lock", "config", "serve")
//		phasetest.AssertRespectsDependencies(t, h.Events(0))
//	}
//
// or on bare phases, with [New] in place of app.New and Wrap. The
// Harness stops what it runs when the test ends. A wrapped App is stopped
// without its drain delay, which only gives checkers time to see the port
// go NOT_SERVING; a test of that sets [Harness.KeepDrainDelay].
//
// and against a running process, black-box:
//
//	func TestDaemonStartupOrder(t *testing.T) {
//		s := phasetest.Follow(t, "http://127.0.0.1:7000/debug/events")
//		phasetest.WaitState(t, s, lifecycle.StateServing, time.Minute)
//		phasetest.AssertOrder(t, s.Events(0), "lock", "listen", "serve")
//	}
//
// A test that watches the start from outside (its health answers, a drain
// while it runs) starts it with [Harness.StartInBackground] instead of
// RequireStart; [Harness.Drain] of a wrapped App stops the App as a whole,
// its port included, as the cleanup does.
//
// The assertions read a lifecycle's event log, which records every
// transition once and in order; they do not sample states, so they neither
// miss a phase that ran quickly nor depend on timing. [AssertOrder] checks
// that named phases ran one after another; [AssertRespectsDependencies]
// checks every phase against the DependsOn its events carry;
// [AssertOverlap] checks that two phases ran in parallel, by sequence
// numbers too; [AssertTookAtMost] and [AssertTookAtLeast] bound how long a
// phase took, from its events' times (the one assertion on clocks: use
// generous bounds); [AssertConsistent] checks that the log itself is whole. [WaitState] and
// [WaitPhase] replay the log from its start, so they see states already
// passed, and fail fast when what they wait for can no longer happen.
// [WaitSnapshot] waits for what the log does not name in one event (a
// warning raised or cleared, a task's progress) on the latest snapshots.
//
// To run the service's own binary for a black-box test (build it once,
// start it, learn its address, signal it, wait for its exit code) and to
// check the health its port answers before and after serving, use package
// phasetest/proc; examples/adopter in the repository is a whole service
// tested that way.
//
// The package's examples (Recorder, AssertOverlap) are whole tests to copy;
// examples/adopter in the repository is a whole service tested both in
// process and black-box.
package phasetest
