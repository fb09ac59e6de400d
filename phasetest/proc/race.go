//go:build race

package proc

// Race reports whether the test binary has the race detector, and so
// whether the binaries [Builds.Build] makes have it.
const Race = true
