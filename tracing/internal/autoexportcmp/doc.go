// Package autoexportcmp measures go.opentelemetry.io/contrib/exporters/autoexport
// against the tracing and metrics packages' own reading of OTEL_*, so that
// the choice between them rests on numbers and facts that can be checked
// again when autoexport changes.
//
// It is a module of its own so that the library's go.mod does not carry
// autoexport. Run it from this directory:
//
//	go test -run . -bench . -benchmem -count 5
//
// TestAutoexportFacts pins what autoexport v0.72.0 does with the settings
// phasegate must honour; it fails when a new version changes any of them,
// which is the moment to reconsider it. BenchmarkSetup builds the same
// provider both ways in one run. The dependency weight is measured in the
// root module: `go list -m all | wc -l` before and after
// `go get go.opentelemetry.io/contrib/exporters/autoexport@v0.72.0`, and
// `go list -deps ./cmd/phasegate | wc -l` and the binary's size with and
// without a blank import of autoexport in cmd/phasegate.
package autoexportcmp
