package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/phasegate/phasegate/app"
	"github.com/phasegate/phasegate/lifecycle"
)

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
	if !*watch {
		v, raw, err := fetchView(ctx, client, url)
		if err != nil {
			fmt.Fprintf(e.stderr, "phasegate status: %v\n", err)
			return exitUsage
		}
		if *asJSON {
			_, _ = e.stdout.Write(raw)
		} else {
			renderTable(e.stdout, v)
		}
		if v.State != lifecycle.StateServing {
			return exitFailed
		}
		return exitOK
	}
	return watchStatus(ctx, e, client, url, *interval)
}

func fetchView(ctx context.Context, c *http.Client, url string) (app.View, []byte, error) {
	var v app.View
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return v, nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return v, nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return v, nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return v, nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		return v, nil, fmt.Errorf("GET %s: %w", url, err)
	}
	return v, raw, nil
}

// renderTable writes the phases and background tasks as a table.
func renderTable(w io.Writer, v app.View) {
	fmt.Fprintf(w, "lifecycle %s since %s", v.State, v.Since.Format(time.RFC3339))
	if v.Degraded {
		fmt.Fprint(w, " (degraded)")
	}
	if v.Error != "" {
		fmt.Fprintf(w, ": %s", v.Error)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PHASE\tSTATE\tDURATION\tPROGRESS")
	for _, p := range v.Phases {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", p.Name, p.State, fmtDuration(p), fmtProgress(p))
	}
	for _, t := range v.Tasks {
		fmt.Fprintf(tw, "%s (task of %s)\t%s\t%s\t%s\n", t.Name, t.Phase, t.State, fmtDuration(t), fmtProgress(t))
	}
	_ = tw.Flush()
}

func fmtDuration(p app.PhaseView) string {
	if p.Started.IsZero() {
		return "-"
	}
	return p.Duration.Round(time.Millisecond).String()
}

func fmtProgress(p app.PhaseView) string {
	s := p.Progress.String()
	if p.Error != "" && (p.State == string(lifecycle.PhaseFailed) || p.State == string(lifecycle.PhaseRetrying)) {
		if s != "" {
			s += "; "
		}
		s += "error: " + p.Error
	}
	if s == "" {
		return "-"
	}
	return s
}

// watchStatus follows the lifecycle until it leaves starting. On a terminal
// it draws a live view (see liveView); otherwise it prints a plain line per
// change, at most one a second while only the figures move.
func watchStatus(ctx context.Context, e env, c *http.Client, url string, every time.Duration) int {
	t := time.NewTicker(every)
	defer t.Stop()
	var (
		live      *liveView
		lastShape string // the plain line without its figures
		last      string
		lastAt    time.Time
	)
	if e.isTTY {
		live = &liveView{w: e.stdout, width: termWidth(e.stdout)}
		defer live.close()
	}
	failures := 0
	for {
		v, _, err := fetchView(ctx, c, url)
		switch {
		case err != nil:
			failures++
			if failures*int(every) > int(30*time.Second) {
				if live != nil {
					live.close()
				}
				fmt.Fprintf(e.stderr, "phasegate status: %v\n", err)
				return exitUsage
			}
		case live != nil:
			live.draw(v)
		default:
			shape, line := plainLine(v, false), plainLine(v, true)
			if line != last && (shape != lastShape || time.Since(lastAt) >= time.Second || v.State != lifecycle.StateStarting) {
				fmt.Fprintln(e.stdout, line)
				last, lastShape, lastAt = line, shape, time.Now()
			}
		}
		if err == nil {
			failures = 0
			switch v.State {
			case lifecycle.StateServing:
				return exitOK
			case lifecycle.StateFailed, lifecycle.StateStopped, lifecycle.StateDraining:
				return exitFailed
			}
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return exitFailed
		}
	}
}

// plainLine summarises a View on one line: the state and every phase that
// is not pending; with figures, a running phase's rate and time left too.
func plainLine(v app.View, figures bool) string {
	parts := []string{string(v.State)}
	for _, p := range v.Phases {
		if p.State == string(lifecycle.PhasePending) {
			continue
		}
		s := p.Name + "=" + p.State
		if p.State != string(lifecycle.PhaseSucceeded) {
			var in []string
			if prog := p.Progress.String(); prog != "" && figures {
				in = append(in, prog)
			}
			if e := viewEstimate(p); figures && p.State == string(lifecycle.PhaseRunning) && e.String() != "" {
				in = append(in, e.String())
			}
			if len(in) > 0 {
				s += "(" + strings.Join(in, ", ") + ")"
			}
		} else if figures {
			s += "(" + fmtDuration(p) + ")"
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, " ")
}

func viewEstimate(p app.PhaseView) lifecycle.Estimate {
	return lifecycle.Estimate{Rate: p.Rate, Remaining: p.ETA, OK: p.ETA > 0}
}
