package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"time"

	"github.com/phasegate/phasegate/app/status"
)

// statusCmd is `phasegate status`: package app/status's, which an
// adopter's cmd/phasegate-status runs too, on the daemon's default port.
func statusCmd(ctx context.Context, e env) int {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:5008", "daemon address")
	asJSON := fs.Bool("json", false, "print the lifecycle as JSON")
	watch := fs.Bool("watch", false, "follow the phases until the daemon serves (or fails)")
	interval := fs.Duration("interval", 250*time.Millisecond, "how often --watch asks")
	if code, done := e.parseCommand(fs, "status [flags]"); done {
		return code
	}
	client := &http.Client{Timeout: 2 * time.Second}
	url := "http://" + *addr + "/debug/lifecycle"
	if *watch {
		return status.Follow(ctx, client, url, status.Watch{Out: e.stdout, Err: e.stderr, Name: "phasegate status", Terminal: e.isTTY, Every: *interval})
	}
	v, raw, err := status.Fetch(ctx, client, url)
	if err != nil {
		fmt.Fprintf(e.stderr, "phasegate status: %v\n", err)
		return exitUsage
	}
	if *asJSON {
		_, _ = e.stdout.Write(raw)
	} else {
		status.WriteTable(e.stdout, v)
	}
	return status.ExitCode(v)
}

// eventsCmd is `phasegate events`: the lifecycle's events, one a line.
func eventsCmd(ctx context.Context, e env) int {
	fs := flag.NewFlagSet("events", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:5008", "daemon address")
	untilOver := fs.Bool("until-over", false, "stop once the start is over (served, failed or drained)")
	if code, done := e.parseCommand(fs, "events [flags]"); done {
		return code
	}
	code, err := status.PrintEvents(ctx, &http.Client{}, "http://"+*addr+"/debug/events", e.stdout, *untilOver)
	if err != nil {
		fmt.Fprintf(e.stderr, "phasegate events: %v\n", err)
	}
	return code
}
