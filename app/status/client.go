package status

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/phasegate/phasegate/lifecycle"
)

// Exit codes of the commands: a supervisor's or a script's contract, the
// same as the daemon's CLI.
const (
	// ExitServing: the service serves (status, watch, probe).
	ExitServing = 0
	// ExitNotServing: it answered, and does not serve: starting, failed,
	// draining or stopped.
	ExitNotServing = 1
	// ExitUnreachable: no answer, a bad flag, or an answer not understood.
	ExitUnreachable = 2
)

// maxView bounds a View read: far above any lifecycle's.
const maxView = 4 << 20

// Fetch reads the View an App serves at url (its /debug/lifecycle) and
// returns it with the raw JSON.
func Fetch(ctx context.Context, c *http.Client, url string) (View, []byte, error) {
	var v View
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return v, nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return v, nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxView))
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

// WriteTable writes v's phases and background tasks as a table.
func WriteTable(w io.Writer, v View) {
	fmt.Fprintf(w, "lifecycle %s since %s", v.State, v.Since.Format(time.RFC3339))
	if v.Degraded {
		fmt.Fprint(w, " (degraded)")
	}
	if v.Error != "" {
		fmt.Fprintf(w, ": %s", v.Error)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	withUsual := slices.ContainsFunc(append(slices.Clone(v.Phases), v.Tasks...), func(p PhaseView) bool { return p.Usual != "" })
	row := func(name string, p PhaseView) {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s", name, p.State, fmtDuration(p), fmtProgress(p))
		if withUsual {
			fmt.Fprintf(tw, "\t%s", fmtUsual(p))
		}
		fmt.Fprintln(tw)
	}
	if withUsual {
		fmt.Fprintln(tw, "PHASE\tSTATE\tDURATION\tPROGRESS\tUSUALLY")
	} else {
		fmt.Fprintln(tw, "PHASE\tSTATE\tDURATION\tPROGRESS")
	}
	for _, p := range v.Phases {
		row(p.Name, p)
	}
	for _, t := range v.Tasks {
		row(t.Name+" (task of "+t.Phase+")", t)
	}
	_ = tw.Flush()
}

// fmtUsual is the USUALLY column: the step's usual, marked when it is
// much slower this time.
func fmtUsual(p PhaseView) string {
	switch {
	case p.Usual == "":
		return "-"
	case p.Slow:
		return "SLOWER THAN USUAL: " + p.Usual
	}
	return p.Usual
}

// ExitCode is the exit code for a View: ExitServing when it serves,
// ExitNotServing otherwise.
func ExitCode(v View) int {
	if v.State == lifecycle.StateServing {
		return ExitServing
	}
	return ExitNotServing
}

// fmtDuration is the DURATION column: how long the step ran, and for a
// phase not yet over the most it can take before it fails for good.
func fmtDuration(p PhaseView) string {
	d := "-"
	if !p.Started.IsZero() {
		d = p.Duration.Round(time.Millisecond).String()
	}
	if p.WorstCase > 0 && p.Ended.IsZero() {
		d += ", at most " + p.WorstCase.Round(time.Millisecond).String()
	}
	return d
}

func fmtProgress(p PhaseView) string {
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

// Watch says how [Follow] shows a start.
type Watch struct {
	// Out receives the view; Err the error that ends it, after Name
	// ("phasegate status: …") when set.
	Out, Err io.Writer
	Name     string
	// Terminal draws a live view redrawn in place on Out, which must be
	// a terminal; otherwise a plain line per change, at most one a
	// second while only the figures move.
	Terminal bool
	// Every is how often the View is asked for; 250ms when zero.
	Every time.Duration
	// GiveUp is how long the service may not answer before Follow gives
	// up; 30s when zero.
	GiveUp time.Duration
}

// Follow shows the start of the App whose View is at url until it leaves
// starting, and returns the exit code: ExitServing once it serves,
// ExitNotServing when it failed, drained or stopped (or ctx ended),
// ExitUnreachable after GiveUp without an answer.
func Follow(ctx context.Context, c *http.Client, url string, o Watch) int {
	if o.Every <= 0 {
		o.Every = 250 * time.Millisecond
	}
	if o.GiveUp <= 0 {
		o.GiveUp = 30 * time.Second
	}
	t := time.NewTicker(o.Every)
	defer t.Stop()
	var (
		live      *liveView
		lastShape string // the plain line without its figures
		last      string
		lastAt    time.Time
		failingAt time.Time
	)
	if o.Terminal {
		live = &liveView{w: o.Out, width: termWidth(o.Out)}
		defer live.close()
	}
	for {
		v, _, err := Fetch(ctx, c, url)
		switch {
		case err != nil:
			if failingAt.IsZero() {
				failingAt = time.Now()
			}
			if time.Since(failingAt) > o.GiveUp {
				if live != nil {
					live.close()
				}
				if o.Name != "" {
					fmt.Fprintf(o.Err, "%s: ", o.Name)
				}
				fmt.Fprintln(o.Err, err)
				return ExitUnreachable
			}
		case live != nil:
			live.draw(v)
		default:
			shape, line := plainLine(v, false), plainLine(v, true)
			if line != last && (shape != lastShape || time.Since(lastAt) >= time.Second || v.State != lifecycle.StateStarting) {
				fmt.Fprintln(o.Out, line)
				last, lastShape, lastAt = line, shape, time.Now()
			}
		}
		if err == nil {
			failingAt = time.Time{}
			switch v.State {
			case lifecycle.StateServing:
				return ExitServing
			case lifecycle.StateFailed, lifecycle.StateStopped, lifecycle.StateDraining:
				return ExitNotServing
			}
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return ExitNotServing
		}
	}
}

// plainLine summarises a View on one line: the state and every phase that
// is not pending; with figures, a running phase's rate and time left too.
func plainLine(v View, figures bool) string {
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

func viewEstimate(p PhaseView) lifecycle.Estimate {
	return lifecycle.Estimate{Rate: p.Rate, Remaining: p.ETA, OK: p.ETA > 0}
}

// ProbeHTTP asks the service at addr GET /readyz?verbose (over TLS with
// tc when not nil): serving is whether it answered 200, detail its body.
// Any answer other than 200 or 503 is an error.
func ProbeHTTP(ctx context.Context, addr string, tc *tls.Config) (serving bool, detail string, err error) {
	scheme, client := "http", http.DefaultClient
	if tc != nil {
		tr := &http.Transport{TLSClientConfig: tc}
		defer tr.CloseIdleConnections()
		scheme, client = "https", &http.Client{Transport: tr}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, scheme+"://"+addr+"/readyz?verbose", nil)
	if err != nil {
		return false, "", err
	}
	resp, err := client.Do(req)
	if err != nil {
		return false, "", err
	}
	defer resp.Body.Close()
	// One Read may return part of the body; the verbose check list is small.
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return false, "", err
	}
	switch resp.StatusCode {
	case http.StatusOK:
		return true, string(body), nil
	case http.StatusServiceUnavailable:
		return false, string(body), nil
	}
	return false, "", fmt.Errorf("unexpected HTTP status %s", resp.Status)
}
