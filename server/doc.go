// Package server serves gRPC and HTTP on one TCP port from the first
// millisecond of a daemon's start.
//
// It serves while the daemon's lifecycle is still running its startup
// phases.
//
// One listener is shared through a connection multiplexer (cmux, kept
// private to this package): HTTP/2 connections whose first request has
// content-type application/grpc go to the gRPC server, everything else to
// the HTTP server. Connections that send nothing are dropped after
// [Config.SniffTimeout], when it is set, and never hold up a drain.
//
// What peers can take of the server is bounded ([Limits]): connections in
// total and per peer, counted from the moment they are accepted (a peer is
// a local user, told apart by the kernel's record of its uid even on
// loopback, or a remote address), with a share kept for root and the
// server's own user, and, on a surface that says at accept which peers it
// knows ([Config.Admit]), a share kept for them and the others refused at
// once; the size of a gRPC message and the calls in flight on
// a connection; idle connections, HTTP and gRPC alike, are closed. A
// connection over a bound is closed at once; an accept that fails for want
// of descriptors is retried with a backoff, and [Server.ConnStats] says
// when the server last could not take a connection.
//
// grpc-go forbids registering a service once it serves (the process dies),
// so services are late-bound: [Server.Declare] every service before
// [Server.Serve], [Server.Bind] its implementation whenever it is ready.
// Until then, and while draining, a call fails at once with
// codes.Unavailable and a message that names the phase the daemon is in and
// its progress — never a hang, never Unimplemented. Once bound and open, a
// call is dispatched by grpc-go as usual: interceptors, stats handlers,
// GetServiceInfo and server reflection all see it.
//
// HTTP routes of the application are gated the same way, by choice:
// [Server.DeclareHTTP] a route early and [Server.BindHTTP] its handler when
// the phase that makes it ready has run. Until the route is bound and the
// gate open, and while draining, a request gets 503 with Retry-After and
// the same words a gRPC caller gets. Routes added with [Server.Handle]
// (health, metrics, debug) answer whatever the state.
//
// [Server.Drain] shuts down in order: health NOT_SERVING first, a drain
// delay, GracefulStop bounded by a stop timeout and then Stop, HTTP
// Shutdown, the listener closed.
//
// A daemon wires a Server to its lifecycle like this (see the Example):
//
//	listen phase:   Serve (binds the port and serves at once); Stop: Drain
//	register phase: Bind each service implementation
//	serve phase:    nothing to do — the gate opens when the lifecycle serves;
//	                Stop: Drain, so the port drains before the phases before it
//	                are undone
//
// The package knows nothing of a daemon's phases or services: any daemon
// with its own phase graph can use it.
package server
