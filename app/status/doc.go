// Package status is what an operator asks an App's port: the lifecycle's
// view, and the commands that read it.
//
// The [View] is the JSON an App serves at /debug/lifecycle, made by
// [NewView] and [Handler]; the commands (status, status --watch, probe,
// events) are what [Main] runs and cmd/phasegate-status is. It links net/http and the framework's
// lifecycle types, not the App, gRPC or OpenTelemetry's SDK, so a
// service's own status tool stays a few MB; the daemon's CLI reuses the
// same functions.
package status
