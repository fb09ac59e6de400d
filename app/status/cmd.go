package status

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// Env is what Main runs in: its output, and whether Stdout is a terminal
// (status --watch then draws a live view).
type Env struct {
	Stdout, Stderr io.Writer
	Terminal       bool
}

// Usage is Main's synopsis.
const Usage = `usage: %[1]s <command> [flags]

commands:
  status [--addr A] [--json]             the phases and background tasks, once
  status --watch [--addr A]              follow the start until it serves or fails
  probe [--addr A] [--timeout D]         GET /readyz?verbose: exit 0 serving, 1 not
  events [--addr A] [--until-over]       the lifecycle's events, one a line

Exit codes: 0 serving, 1 answered but not serving, 2 no answer or a bad flag.
`

// Main runs one of the commands an operator asks an App's port (status,
// status --watch, probe, events) with args (the command first), as a
// program called name, and returns its exit code. It links only the
// framework's views and net/http: cmd/phasegate-status is Main alone, and
// a service may make these commands its own.
func Main(ctx context.Context, name string, args []string, e Env) int {
	if len(args) == 0 {
		fmt.Fprintf(e.Stderr, Usage, name)
		return ExitUnreachable
	}
	cmd, args := args[0], args[1:]
	fs := flag.NewFlagSet(name+" "+cmd, flag.ContinueOnError)
	fs.SetOutput(e.Stderr)
	addr := fs.String("addr", "127.0.0.1:7000", "the App's port (host:port)")
	switch cmd {
	case "status":
		asJSON := fs.Bool("json", false, "print the lifecycle as JSON")
		watch := fs.Bool("watch", false, "follow the start until it serves or fails")
		every := fs.Duration("interval", 250*time.Millisecond, "how often --watch asks")
		if fs.Parse(args) != nil {
			return ExitUnreachable
		}
		return statusCmd(ctx, e, name+" status", "http://"+*addr+"/debug/lifecycle", *asJSON, *watch, *every)
	case "probe":
		timeout := fs.Duration("timeout", 2*time.Second, "how long to wait for an answer")
		if fs.Parse(args) != nil {
			return ExitUnreachable
		}
		ctx, cancel := context.WithTimeout(ctx, *timeout)
		defer cancel()
		serving, detail, err := ProbeHTTP(ctx, *addr, nil)
		if err != nil {
			fmt.Fprintf(e.Stderr, "%s probe: %s: %v\n", name, *addr, err)
			return ExitUnreachable
		}
		fmt.Fprint(e.Stdout, strings.TrimRight(detail, "\n")+"\n")
		if !serving {
			return ExitNotServing
		}
		return ExitServing
	case "events":
		untilOver := fs.Bool("until-over", false, "stop once the start is over (served, failed or drained)")
		if fs.Parse(args) != nil {
			return ExitUnreachable
		}
		code, err := PrintEvents(ctx, &http.Client{}, "http://"+*addr+"/debug/events", e.Stdout, *untilOver)
		if err != nil {
			fmt.Fprintf(e.Stderr, "%s events: %v\n", name, err)
		}
		return code
	case "help", "-h", "-help", "--help":
		fmt.Fprintf(e.Stdout, Usage, name)
		return ExitServing
	}
	fmt.Fprintf(e.Stderr, "%s: unknown command %q\n"+Usage, name, cmd, name)
	return ExitUnreachable
}

// statusCmd is status, once or --watch.
func statusCmd(ctx context.Context, e Env, name, url string, asJSON, watch bool, every time.Duration) int {
	c := &http.Client{Timeout: 2 * time.Second}
	if watch {
		return Follow(ctx, c, url, Watch{Out: e.Stdout, Err: e.Stderr, Name: name, Terminal: e.Terminal, Every: every})
	}
	v, raw, err := Fetch(ctx, c, url)
	if err != nil {
		fmt.Fprintf(e.Stderr, "%s: %v\n", name, err)
		return ExitUnreachable
	}
	if asJSON {
		_, _ = e.Stdout.Write(raw)
	} else {
		WriteTable(e.Stdout, v)
	}
	return ExitCode(v)
}
