// Package health renders one source of truth, a [lifecycle.Lifecycle]'s
// snapshots, in every dialect a node agent checks a daemon by.
//
// The dialects:
//
//   - grpc.health.v1 (Check, Watch, List) through google.golang.org/grpc/health:
//     the service "" is the overall readiness, each application service is
//     reported by its full name, and every phase has an entry
//     "phasegate.phase.<name>" that is SERVING once the phase succeeded.
//     See [Checker].
//   - HTTP: /health answers Nomad and Consul HTTP checks with a body in the
//     IETF health-check format (application/health+json); /livez, /readyz and
//     /startupz follow the kube-apiserver conventions (?verbose, ?exclude).
//     See [Handler].
//   - systemd's sd_notify protocol: STATUS, EXTEND_TIMEOUT_USEC, READY,
//     STOPPING and WATCHDOG, in package
//     [github.com/phasegate/phasegate/health/sdnotify], which pushes to
//     systemd rather than answering requests and shares this package's
//     words ([Describe], [DescribeWithETA]).
//
// What each lifecycle state shows:
//
//	state     grpc ""      /health  /readyz  /livez  /startupz  sd_notify
//	created   NOT_SERVING  503      503      200     503        STATUS
//	starting  NOT_SERVING  503      503      200     503        STATUS, EXTEND_TIMEOUT_USEC
//	serving   SERVING      200      200      200     200        READY=1
//	draining  NOT_SERVING  503      503      200     200 (1)    STOPPING=1, STATUS=draining
//	stopped   NOT_SERVING  503      503      200     200 (1)    STATUS=stopped
//	failed    NOT_SERVING  503      503      503     503        STATUS=failed: …
//
// (1) 503 when the lifecycle never served: a drain that arrives during the
// start reads as draining and then stopped everywhere, never failed, but
// the start did not complete. A checker shut down by a draining server
// reads as draining whatever its lifecycle still does.
//
// Warnings ([lifecycle.Lifecycle.Warn]: egress prerequisites missing,
// leases lost across a restart, dead slots still being reclaimed) leave a
// serving daemon serving in every dialect and say so: /health is 200 with
// status "warn" and a check "warning:<name>" each; /livez and /readyz pass
// and list them with ?verbose; gRPC stays SERVING; STATUS reads "serving; 2
// warnings: …". A warning named like a running background task shows that
// task's progress, rate and time left.
//
// In /health, the whole "status" answers "may traffic come here?" and each
// check's answers "how is this part doing?"; they differ on purpose. The
// whole is "pass" or "warn" only while serving (200), "fail" otherwise
// (503), starting included. A check "phase:<name>" is "pass" once the
// phase succeeded; "warn" while it is pending, running or retrying (not
// done yet, not broken), and when a drain during the start cancelled or
// skipped it; "fail" when it failed, and when it was cancelled or skipped
// because the start failed. So during a start, pending phases read "warn"
// while the whole reads "fail": the service is not ready, and nothing in
// it is broken. A check "task:<name>" is "pass" while its background task
// runs or once it succeeded, and "warn" once it failed: degraded, not down
// (the whole then reads "warn" too).
//
// "Not ready" is always 503, never 429: Consul reads 429 as a warning and
// Nomad as a failure.
//
// The package reads lifecycle state and never changes it. Its one piece of
// state of its own is a one-way latch, [Checker.Shutdown], that a server sets
// when it starts draining before the lifecycle itself does, so that checks
// see the change first.
package health
