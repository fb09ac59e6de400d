// Package minimal holds the smallest service on each of the three
// wirings, for the weight and failing-fast rows of docs/FRAMEWORK.md: one
// config step, then one port serving gRPC (with grpc.health.v1) and HTTP
// (/health), until SIGINT or SIGTERM. Given -fail, the config step fails
// as a bad flag value would, and the process exits non-zero; given -slow,
// the config step takes that long, for a signal to arrive during the
// start. Each takes it as its wiring would: phasegate's phase ends early
// when its context does; fx's constructor and run's step before the group
// have no context, and sleep. pgmin is phasegate
// (one phase, app.Main), fxmin uber-go/fx, runmin oklog/run; package
// compare/weigh builds and measures them. Each is one file that imports
// nothing of this module, so that weigh can build it in a module of its
// own, as an adopter's; the fx and run ones therefore repeat the one-port
// server of their catalogs.
package minimal
