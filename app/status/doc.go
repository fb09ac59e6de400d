// Package status is what an operator asks an App's port, from the client
// side and the server's: the lifecycle's [View] (the JSON an App serves at
// /debug/lifecycle, made by [NewView] and [Handler]), and the commands
// that read it (status, status --watch, probe, events), which [Main] runs
// and cmd/phasegate-status is. It links net/http and the framework's
// lifecycle types, not the App, gRPC or OpenTelemetry's SDK, so a
// service's own status tool stays a few MB; the daemon's CLI reuses the
// same functions.
package status
