// Package sdnotify tells systemd how a [lifecycle.Lifecycle] is doing, over
// the sd_notify protocol.
//
// It sends STATUS while it starts (with the running phase's progress, rate
// and time left), EXTEND_TIMEOUT_USEC while the start makes progress or once
// for a start budget, READY=1 when it serves, STOPPING=1 when it drains, and
// WATCHDOG=1 while a liveness check passes. See [Notifier].
//
// It is a dialect of health of its own, apart from the request-answering
// ones (grpc.health.v1, HTTP) in package health, because its job differs:
// it pushes to systemd from goroutines of its own, rate-limits what it
// sends, bargains for start time and runs the watchdog's checks. The words
// it sends are the ones every dialect shares,
// [github.com/phasegate/phasegate/health.DescribeWithETA], so that STATUS
// and /health say the same thing; the table in package health's
// documentation gives what each lifecycle state shows in each dialect.
//
// Like package health, it reads lifecycle state and never changes it.
package sdnotify
