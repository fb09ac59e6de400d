//go:build race

package proctest

// Race reports whether the test binary, and so the binaries Build makes,
// has the race detector.
const Race = true
