package proc

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/phasegate/phasegate/lifecycle"
)

// DialectGRPC is the [Answer.Dialect] of grpc.health.v1's answers, for the
// whole server (service "").
const DialectGRPC = "grpc"

// Answer is one health answer a port gave, or the same answer given
// several times in a row.
type Answer struct {
	// Dialect is [DialectGRPC], or the HTTP path asked ("/readyz").
	Dialect string
	// Status is the answer: "SERVING", "NOT_SERVING" (or another
	// grpc.health.v1 status) in gRPC, the status code ("200", "503") in
	// HTTP.
	Status string
	// First and Last are when the test received the answer the first and
	// the last time in this row.
	First, Last time.Time
	// Count is how many times in a row the answer came.
	Count int
}

// Serving reports whether the answer says serving: SERVING, or 200.
func (a Answer) Serving() bool { return a.Status == "SERVING" || a.Status == "200" }

// NotServing reports whether the answer says not serving yet, the way a
// gated port does: NOT_SERVING, or 503.
func (a Answer) NotServing() bool { return a.Status == "NOT_SERVING" || a.Status == "503" }

func (a Answer) String() string {
	return fmt.Sprintf("%s %s ×%d %s–%s", a.Dialect, a.Status, a.Count,
		a.First.Format("15:04:05.000000"), a.Last.Format("15:04:05.000000"))
}

// HealthOption configures [WatchHealth].
type HealthOption func(*healthConfig)

type healthConfig struct {
	paths    []string
	interval time.Duration
}

// HTTPPaths sets the HTTP paths asked, instead of "/readyz"; none asks
// gRPC alone.
func HTTPPaths(paths ...string) HealthOption {
	return func(c *healthConfig) { c.paths = paths }
}

// PollInterval sets how long the HTTP asker waits between two answers,
// instead of 2 ms.
func PollInterval(d time.Duration) HealthOption {
	return func(c *healthConfig) { c.interval = d }
}

// HealthWatch keeps the health answers a port gives, in the order they
// came, asked by real clients over the real port: a grpc.health.v1 Watch
// stream (its answers are every change of status) and an HTTP GET of each
// path, one after the other. Asking starts at once and ends with
// [HealthWatch.Close] or the test.
type HealthWatch struct {
	addr    string
	dialect []string // in the order given: DialectGRPC, then the paths
	cancel  context.CancelFunc
	wg      sync.WaitGroup

	mu      sync.Mutex
	answers []Answer
	wake    chan struct{} // closed at the next answer; nil while nobody waits
}

// WatchHealth starts asking addr (host:port) for its health in gRPC and
// over HTTP. Start it before the lifecycle turns serving, and hold the
// start open until it has seen the port answer (a phase waiting on
// something the test controls, [HealthWatch.WaitAnswer]); otherwise there
// is nothing before serving to judge.
func WatchHealth(t testing.TB, addr string, opts ...HealthOption) *HealthWatch {
	t.Helper()
	c := healthConfig{paths: []string{"/readyz"}, interval: 2 * time.Millisecond}
	for _, opt := range opts {
		opt(&c)
	}
	conn, err := grpc.NewClient(addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 5 * time.Millisecond, Multiplier: 1.6, MaxDelay: 100 * time.Millisecond}}))
	if err != nil {
		t.Fatalf("proc: a gRPC client of %s: %v", addr, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	w := &HealthWatch{addr: addr, dialect: append([]string{DialectGRPC}, c.paths...), cancel: cancel}
	w.wg.Add(1 + len(c.paths))
	go func() {
		defer w.wg.Done()
		w.watchGRPC(ctx, healthpb.NewHealthClient(conn))
	}()
	client := &http.Client{Timeout: 5 * time.Second}
	for _, path := range c.paths {
		go func() {
			defer w.wg.Done()
			w.pollHTTP(ctx, client, path, c.interval)
		}()
	}
	t.Cleanup(func() {
		w.Close()
		_ = conn.Close()
		client.CloseIdleConnections()
	})
	return w
}

// watchGRPC follows grpc.health.v1 Watch, again whenever the stream ends
// (the port not bound yet, or draining), until ctx ends.
func (w *HealthWatch) watchGRPC(ctx context.Context, hc healthpb.HealthClient) {
	for ctx.Err() == nil {
		stream, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
		for err == nil {
			var r *healthpb.HealthCheckResponse
			if r, err = stream.Recv(); err == nil {
				w.record(DialectGRPC, r.GetStatus().String())
			}
		}
		pause(ctx, 5*time.Millisecond)
	}
}

// pollHTTP asks path, one request after the other, until ctx ends.
func (w *HealthWatch) pollHTTP(ctx context.Context, c *http.Client, path string, interval time.Duration) {
	url := "http://" + w.addr + path
	for ctx.Err() == nil {
		if code, err := get(ctx, c, url); err == nil {
			w.record(path, strconv.Itoa(code))
		}
		pause(ctx, interval)
	}
}

func get(ctx context.Context, c *http.Client, url string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}

func pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// record notes an answer received now.
func (w *HealthWatch) record(dialect, status string) {
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := len(w.answers) - 1; i >= 0; i-- {
		if a := &w.answers[i]; a.Dialect == dialect {
			if a.Status == status {
				a.Last = now
				a.Count++
				w.wakeLocked()
				return
			}
			break
		}
	}
	w.answers = append(w.answers, Answer{Dialect: dialect, Status: status, First: now, Last: now, Count: 1})
	w.wakeLocked()
}

func (w *HealthWatch) wakeLocked() {
	if w.wake != nil {
		close(w.wake)
		w.wake = nil
	}
}

// Close stops asking and returns once the askers have; the answers stay.
// It is idempotent; the test's end calls it.
func (w *HealthWatch) Close() {
	w.cancel()
	w.wg.Wait()
}

// Answers returns the answers so far, every dialect's, in the order they
// first came.
func (w *HealthWatch) Answers() []Answer {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]Answer(nil), w.answers...)
}

// latest returns each dialect's latest answer, and a channel closed at the
// next one.
func (w *HealthWatch) latest() (map[string]Answer, <-chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	last := map[string]Answer{}
	for _, a := range w.answers {
		last[a.Dialect] = a
	}
	if w.wake == nil {
		w.wake = make(chan struct{})
	}
	return last, w.wake
}

// WaitAnswer waits until every dialect's latest answer satisfies ok
// ([Answer.Serving], [Answer.NotServing]) and returns them; it fails the
// test with the answers seen when timeout passes first.
func (w *HealthWatch) WaitAnswer(t testing.TB, ok func(Answer) bool, timeout time.Duration) map[string]Answer {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		last, wake := w.latest()
		all := true
		for _, d := range w.dialect {
			a, seen := last[d]
			all = all && seen && ok(a)
		}
		if all {
			return last
		}
		select {
		case <-wake:
		case <-deadline.C:
			t.Fatalf("proc: %s's health did not answer as awaited within %v:\n%s", w.addr, timeout, formatAnswers(w.Answers()))
			return nil
		}
	}
}

// WaitServing waits until every dialect answers serving.
func (w *HealthWatch) WaitServing(t testing.TB, timeout time.Duration) {
	t.Helper()
	w.WaitAnswer(t, Answer.Serving, timeout)
}

// AssertGated checks the answers against the lifecycle's events (the log
// from its first event, as [phasetest.Stream.Events](0) gives it): in every
// dialect, the port answered before the lifecycle turned serving, and only
// NOT_SERVING or 503; no answer received before that event said serving;
// and the port answered serving after it. The event's time is the
// process's clock, the answers' the test's: one host's wall clock. It
// reports a violation with t.Errorf, with the answers, and returns whether
// there was none.
func (w *HealthWatch) AssertGated(t testing.TB, events []lifecycle.Event) bool {
	t.Helper()
	answers := w.Answers()
	var servingAt time.Time
	for _, e := range events {
		if e.Kind == lifecycle.EventLifecycle && e.To == lifecycle.StateServing {
			servingAt = e.Time
			break
		}
	}
	if servingAt.IsZero() {
		t.Errorf("proc: the lifecycle never turned serving in its %d events: nothing to judge the health answers by:\n%s", len(events), formatAnswers(answers))
		return false
	}
	var problems []string
	for _, d := range w.dialect {
		problems = append(problems, gatedProblems(answers, d, servingAt)...)
	}
	if len(problems) == 0 {
		return true
	}
	t.Errorf("proc: %s's health was not gated on serving (turned serving at %s):\n  %s\n%s",
		w.addr, servingAt.Format("15:04:05.000000"), strings.Join(problems, "\n  "), formatAnswers(answers))
	return false
}

// gatedProblems judges one dialect's answers against servingAt.
func gatedProblems(answers []Answer, dialect string, servingAt time.Time) []string {
	var problems []string
	var before, after int
	for _, a := range answers {
		if a.Dialect != dialect {
			continue
		}
		if a.First.Before(servingAt) {
			before++
			if !a.NotServing() {
				problems = append(problems, fmt.Sprintf("%s answered %s before serving", dialect, a.Status))
			}
		}
		if a.Serving() && !a.Last.Before(servingAt) {
			after++
		}
	}
	if before == 0 {
		problems = append(problems, fmt.Sprintf("%s never answered before serving: hold the start until it has", dialect))
	}
	if after == 0 {
		problems = append(problems, fmt.Sprintf("%s never answered serving after serving: wait for it (WaitServing)", dialect))
	}
	return problems
}

func formatAnswers(answers []Answer) string {
	if len(answers) == 0 {
		return "answers: none"
	}
	var b strings.Builder
	b.WriteString("answers:")
	for _, a := range answers {
		b.WriteString("\n  " + a.String())
	}
	return b.String()
}
