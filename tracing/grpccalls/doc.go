// Package grpccalls traces and measures a gRPC server's calls with
// otelgrpc, leaving out health checks and reflection.
//
// The App adds it to its port when it exports spans or metrics (it comes
// with the exporters of tracing/export and metrics/export); a service
// exporting nothing links neither it nor otelgrpc, and pays nothing per
// call. A service with a tracer provider of its own and no exporter, or
// a second gRPC server beside the App's port, adds [ServerOption] itself.
package grpccalls
