// Package compare holds the catalog example wired with uber-go/fx
// (fxcatalog) and with oklog/run (runcatalog), and the tests and benchmarks
// behind docs/FRAMEWORK.md: the three programs serve the same API from the
// same work, and behave as that document says when a client calls during
// the start, when a signal arrives during the start, and how long their
// engines take to run seven no-op steps.
package compare
