package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"
)

// Log messages of the daemon the benchmark follows.
const (
	msgStarting      = "phasegate starting"
	msgServing       = "serving"
	msgReclaimReport = "reclaim report"
	msgPaced         = "background reclaim paced"
	msgRestorePrefix = "restore: "
	msgRestore       = "restore" // the key under which restore lines are kept
	msgVerified      = "restored leases verified"
	msgInside        = "restored leases: inside of their slots verified"
	msgUpgrading     = "SIGHUP: upgrading in place"
)

// reclaimReport is the daemon's "reclaim report" log line.
type reclaimReport struct {
	Found     int           `json:"found"`
	Reclaimed int           `json:"reclaimed"`
	Failed    int           `json:"failed"`
	CutOff    int           `json:"cut_off"`
	RawDur    string        `json:"duration"`
	Duration  time.Duration `json:"-"`
	// At is when the line reached the benchmark; Line is the line.
	At   time.Time `json:"-"`
	Line string    `json:"-"`
}

// reclaimReport returns the daemon's k-th reclaim report (0-based) in its
// JSON log, waiting for it up to timeout.
func (d *daemon) reclaimReport(ctx context.Context, k int, timeout time.Duration) (reclaimReport, error) {
	var r reclaimReport
	ev, err := d.logLine(ctx, msgReclaimReport, k, timeout, &r)
	if err != nil {
		return r, err
	}
	if r.Duration, err = time.ParseDuration(r.RawDur); err != nil {
		return r, fmt.Errorf("reclaim report duration %q: %w", r.RawDur, err)
	}
	r.At, r.Line = ev.at, ev.line
	return r, nil
}

// pacedLine returns the daemon's first "background reclaim paced" line as
// it is (what the pacer did), or "" if there is none: it is logged just
// before the reclaim report, so call it once that has arrived.
func (d *daemon) pacedLine() string {
	d.logs.mu.Lock()
	defer d.logs.mu.Unlock()
	if evs := d.logs.events[msgPaced]; len(evs) > 0 {
		return evs[0].line
	}
	return ""
}

// restoreLine is the daemon's "restore: …" log line: what the start found.
type restoreLine struct {
	Restored int `json:"restored"`
	Adopted  int `json:"adopted"`
	Reclaim  int `json:"reclaim"`
	Lost     int `json:"lost"`
}

// verifiedLine is the daemon's "restored leases verified" log line, which
// ends the verification of the restored leases after SERVING.
type verifiedLine struct {
	Leases     int `json:"leases"`
	Intact     int `json:"intact"`
	Lost       int `json:"lost"`
	Unverified int `json:"unverified"`
	at         time.Time
}

// verifiedLine waits for the daemon's k-th verified line (0-based; one per
// start that restored leases).
func (d *daemon) verifiedLine(ctx context.Context, k int, timeout time.Duration) (verifiedLine, error) {
	var v verifiedLine
	ev, err := d.logLine(ctx, msgVerified, k, timeout, &v)
	v.at = ev.at
	return v, err
}

// logLine waits up to timeout for the daemon's k-th line (0-based) kept
// under key, decodes it into v and returns it as it arrived.
func (d *daemon) logLine(ctx context.Context, key string, k int, timeout time.Duration, v any) (logEvent, error) {
	ev, err := d.logs.wait(ctx, key, k, timeout, d.done)
	if err != nil {
		return ev, fmt.Errorf("%q line: %w\n%s", key, err, d.logs)
	}
	if err := json.Unmarshal([]byte(ev.line), v); err != nil {
		return ev, fmt.Errorf("%q line %q: %w", key, ev.line, err)
	}
	return ev, nil
}

// insideLine is the daemon's line that ends verify-inside, the background
// check of what the restored leases' namespaces hold (guest device,
// egress policy), after the leases' own verification.
type insideLine struct {
	Verified int `json:"verified"`
	Repaired int `json:"repaired"`
	at       time.Time
}

// insideLine waits for the daemon's k-th inside line (0-based; one per
// start that restored leases with something inside to verify).
func (d *daemon) insideLine(ctx context.Context, k int, timeout time.Duration) (insideLine, error) {
	var v insideLine
	ev, err := d.logLine(ctx, msgInside, k, timeout, &v)
	v.at = ev.at
	return v, err
}

// restoreLine returns the daemon's k-th restore line (0-based; one per
// start, upgrades included).
func (d *daemon) restoreLine(ctx context.Context, k int) (restoreLine, error) {
	var r restoreLine
	_, err := d.logLine(ctx, msgRestore, k, 10*time.Second, &r)
	return r, err
}

// logEvent is a log line the benchmark follows, with when it arrived.
type logEvent struct {
	at   time.Time
	line string
}

// logTail keeps the last n lines of a process's output and, with their
// arrival times, every line whose message the benchmark follows.
type logTail struct {
	mu      sync.Mutex
	partial []byte
	events  map[string][]logEvent
	changed chan struct{} // closed and replaced at every event
	last    []string
	n       int
}

func newLogTail(n int) *logTail {
	return &logTail{n: n, events: map[string][]logEvent{}, changed: make(chan struct{})}
}

// followed returns the key under which a line with message msg is kept, or
// "".
func followed(msg string) string {
	switch {
	case strings.HasPrefix(msg, msgRestorePrefix):
		return msgRestore
	case msg == msgStarting, msg == msgServing, msg == msgReclaimReport, msg == msgPaced, msg == msgUpgrading, msg == msgPoolReady, msg == msgVerified, msg == msgInside:
		return msg
	}
	return ""
}

// Write implements io.Writer.
func (l *logTail) Write(p []byte) (int, error) {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.partial = append(l.partial, p...)
	complete := strings.LastIndexByte(string(l.partial), '\n')
	if complete < 0 {
		return len(p), nil
	}
	notify := false
	for _, line := range strings.Split(string(l.partial[:complete]), "\n") {
		var m struct {
			Msg string `json:"msg"`
		}
		if strings.HasPrefix(line, "{") && json.Unmarshal([]byte(line), &m) == nil {
			if key := followed(m.Msg); key != "" {
				l.events[key] = append(l.events[key], logEvent{at: now, line: line})
				notify = true
			}
		}
		l.last = append(l.last, line)
		if len(l.last) > l.n {
			l.last = l.last[len(l.last)-l.n:]
		}
	}
	l.partial = append(l.partial[:0], l.partial[complete+1:]...)
	if notify {
		close(l.changed)
		l.changed = make(chan struct{})
	}
	return len(p), nil
}

// count returns how many lines with key arrived so far.
func (l *logTail) count(key string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.events[key])
}

// wait returns the k-th (0-based) line kept under key, waiting up to
// timeout for it, or until exited is closed.
func (l *logTail) wait(ctx context.Context, key string, k int, timeout time.Duration, exited <-chan struct{}) (logEvent, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		l.mu.Lock()
		evs, changed := l.events[key], l.changed
		l.mu.Unlock()
		if len(evs) > k {
			return evs[k], nil
		}
		select {
		case <-changed:
		case <-exited:
			// The last lines may still be on their way through the pipe.
			exited = nil
			t.Reset(100 * time.Millisecond)
		case <-t.C:
			return logEvent{}, fmt.Errorf("no %q line #%d after %v", key, k+1, timeout)
		case <-ctx.Done():
			return logEvent{}, ctx.Err()
		}
	}
}

// lastLine returns the last line the daemon wrote: after a failed start,
// the cause.
func (d *daemon) lastLine() string {
	d.logs.mu.Lock()
	defer d.logs.mu.Unlock()
	if len(d.logs.last) == 0 {
		return d.exitErr("exited").Error()
	}
	return d.logs.last[len(d.logs.last)-1]
}

// String returns the last lines, for error messages.
func (l *logTail) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.last, "\n")
}
