// Command phasegate-status asks a phasegate App's port what it is doing.
//
// It shows the phases and background tasks once (status) or until the
// start is over (status --watch), whether it serves (probe), and its
// lifecycle's events (events). It is package app/status's Main and nothing else, so it links
// no gRPC, no App and no OpenTelemetry SDK: a few MB, for any service
// built on the framework, the daemon included (whose own CLI runs the same
// code).
//
//	phasegate-status status --watch --addr 127.0.0.1:7000
//	phasegate-status probe --addr 127.0.0.1:7000 && echo serving
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/phasegate/phasegate/app/status"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	fi, _ := os.Stdout.Stat()
	code := status.Main(ctx, "phasegate-status", os.Args[1:], status.Env{
		Stdout: os.Stdout, Stderr: os.Stderr,
		Terminal: fi != nil && fi.Mode()&os.ModeCharDevice != 0,
	})
	stop()
	os.Exit(code)
}
