package sdnotify_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/phasegate/phasegate/health/internal/healthtest"
	"github.com/phasegate/phasegate/health/sdnotify"
	"github.com/phasegate/phasegate/lifecycle"
)

func TestNotifierSequence(t *testing.T) {
	ns := healthtest.ListenNotify(t)
	t.Setenv("WATCHDOG_USEC", "100000")
	t.Setenv("WATCHDOG_PID", strconv.Itoa(os.Getpid()))
	r := healthtest.NewRig(t, false)
	n, err := sdnotify.New(r.LC, sdnotify.Options{
		StatusInterval: time.Millisecond,
		ExtendTimeout:  300 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if !n.Enabled() {
		t.Fatal("notifier not enabled with NOTIFY_SOCKET set")
	}

	r.Start(t)
	ns.WaitLine(t, "naming the phase", func(l string) bool {
		return l == "STATUS=starting: phase reclaim 1200/5000 namespaces"
	})
	// EXTEND_TIMEOUT_USEC is sent at once (and again as the start
	// progresses: TestNotifierExtendsOnlyWhileStartProgresses).
	ns.WaitLine(t, "EXTEND_TIMEOUT_USEC", func(l string) bool { return l == "EXTEND_TIMEOUT_USEC=300000" })
	ns.WaitLine(t, "WATCHDOG=1", func(l string) bool { return l == "WATCHDOG=1" })

	if err := r.Serve(t); err != nil {
		t.Fatal(err)
	}
	ns.WaitLine(t, "READY=1", func(l string) bool { return l == "READY=1" })
	r.Drain(t)
	ns.WaitLine(t, "STOPPING=1", func(l string) bool { return l == "STOPPING=1" })
	n.Close()
	if err := n.Err(); err != nil {
		t.Errorf("Err() = %v", err)
	}
	if err := n.AliveErr(); err != nil {
		t.Errorf("AliveErr() = %v without a check", err)
	}

	lines := ns.Snapshot()
	at := func(l string) int { return slices.Index(lines, l) }
	status := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, "STATUS=starting") })
	extend, ready, stopping := at("EXTEND_TIMEOUT_USEC=300000"), at("READY=1"), at("STOPPING=1")
	if !(status >= 0 && status < extend && extend < ready && ready < stopping) {
		t.Errorf("want STATUS… EXTEND… READY=1 … STOPPING=1 in order; got %q", lines)
	}
	for i, l := range lines[ready:] {
		if strings.HasPrefix(l, "EXTEND_TIMEOUT_USEC=") {
			t.Errorf("EXTEND_TIMEOUT_USEC after READY=1 (line %d): %q", ready+i, lines)
		}
	}
	if !slices.Contains(lines[ready:], "STATUS=serving") || !slices.Contains(lines[stopping:], "STATUS=draining") {
		t.Errorf("no STATUS=serving / STATUS=draining: %q", lines)
	}
}

// A phase that reports progress in a tight loop yields one STATUS line per
// StatusInterval, and the last report is not lost.
func TestNotifierRateLimitsStatus(t *testing.T) {
	for _, tt := range []struct {
		name     string
		interval time.Duration
	}{
		{"held back", time.Hour},
		{"trailing", time.Millisecond},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ns := healthtest.ListenNotify(t)
			reported, release := make(chan struct{}), make(chan struct{})
			lc, err := lifecycle.New([]lifecycle.Phase{{
				Name: "reclaim",
				Run: func(ctx context.Context, p *lifecycle.Progress) error {
					p.SetTotal(1000, "namespaces")
					for range 1000 {
						p.Add(1)
					}
					close(reported)
					select {
					case <-release:
						return nil
					case <-ctx.Done():
						return ctx.Err()
					}
				},
			}}, lifecycle.WithProgressInterval(time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			n, err := sdnotify.New(lc, sdnotify.Options{StatusInterval: tt.interval})
			if err != nil {
				t.Fatal(err)
			}
			defer n.Close()
			started := make(chan error, 1)
			go func() { started <- lc.Start(context.Background()) }()
			healthtest.Recv(t, reported, "progress")
			ns.WaitLine(t, "for starting", func(l string) bool { return strings.HasPrefix(l, "STATUS=starting") })
			if tt.interval == time.Millisecond {
				ns.WaitLine(t, "with the final progress", func(l string) bool {
					return l == "STATUS=starting: phase reclaim 1000/1000 namespaces"
				})
			}
			close(release)
			if err := healthtest.Recv(t, started, "start"); err != nil {
				t.Fatal(err)
			}
			ns.WaitLine(t, "READY=1", func(l string) bool { return l == "READY=1" })
			_ = lc.Drain(context.Background())

			var starting []string
			for _, l := range ns.Snapshot() {
				if strings.HasPrefix(l, "STATUS=starting") {
					starting = append(starting, l)
				}
			}
			if tt.interval == time.Hour && len(starting) != 1 {
				t.Errorf("%d STATUS lines while starting with a 1h limit, want 1: %q", len(starting), starting)
			}
		})
	}
}

func TestNotifierDisabled(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	r := healthtest.NewRig(t, false)
	n, err := sdnotify.New(r.LC, sdnotify.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if n.Enabled() {
		t.Error("enabled without NOTIFY_SOCKET")
	}
	n.Close()
	n.Close()
}

func TestNotifierBadWatchdog(t *testing.T) {
	healthtest.ListenNotify(t)
	t.Setenv("WATCHDOG_USEC", "soon")
	r := healthtest.NewRig(t, false)
	_, err := sdnotify.New(r.LC, sdnotify.Options{})
	if err == nil {
		t.Fatal("no error for WATCHDOG_USEC=soon")
	}
	var numErr *strconv.NumError
	if !errors.As(err, &numErr) {
		t.Errorf("error %v does not wrap the parse error", err)
	}
}

// An explicit zero StatusInterval is no rate limit: each progress report
// is sent as it comes. The phase waits for each line before the next
// report; a limit of a second per line, what a zero once meant, would make
// the 15 reports outlast the test's 10 s bound.
func TestNotifierZeroStatusIntervalSendsEveryReport(t *testing.T) {
	ns := healthtest.ListenNotify(t)
	const steps = 15
	step := make(chan int)
	lc, err := lifecycle.New([]lifecycle.Phase{{
		Name: "reclaim",
		Run: func(ctx context.Context, p *lifecycle.Progress) error {
			p.SetTotal(steps, "namespaces")
			for {
				select {
				case n, ok := <-step:
					if !ok {
						return nil
					}
					p.SetDone(int64(n))
				case <-ctx.Done():
					return ctx.Err()
				}
			}
		},
	}}, lifecycle.WithProgressInterval(time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	n, err := sdnotify.New(lc, sdnotify.Options{StatusInterval: 0})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	started := make(chan error, 1)
	go func() { started <- lc.Start(context.Background()) }()
	deadline := time.Now().Add(healthtest.Wait)
	for i := 1; i <= steps; i++ {
		step <- i
		want := fmt.Sprintf("STATUS=starting: phase reclaim %d/%d namespaces", i, steps)
		// The phase's rate may follow: "(2/s, ~6.5s left)".
		for !slices.ContainsFunc(ns.Snapshot(), func(l string) bool { return l == want || strings.HasPrefix(l, want+" (") }) {
			if time.Now().After(deadline) {
				t.Fatalf("no %q within %v of the first report: is the STATUS rate still limited? got %q", want, healthtest.Wait, ns.Snapshot())
			}
			select {
			case <-ns.Arrived():
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	close(step)
	if err := healthtest.Recv(t, started, "start"); err != nil {
		t.Fatal(err)
	}
	_ = lc.Drain(context.Background())
}

// A zero ExtendTimeout never asks systemd for more time.
func TestNotifierZeroExtendTimeoutNeverExtends(t *testing.T) {
	ns := healthtest.ListenNotify(t)
	r := healthtest.NewRig(t, false)
	n, err := sdnotify.New(r.LC, sdnotify.Options{ExtendTimeout: 0})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	r.Start(t)
	// EXTEND_TIMEOUT_USEC would come in the datagram that says starting.
	ns.WaitLine(t, "saying starting", func(l string) bool { return strings.HasPrefix(l, "STATUS=starting") })
	if err := r.Serve(t); err != nil {
		t.Fatal(err)
	}
	ns.WaitLine(t, "READY=1", func(l string) bool { return l == "READY=1" })
	for _, l := range ns.Snapshot() {
		if strings.HasPrefix(l, "EXTEND_TIMEOUT_USEC=") {
			t.Errorf("%s sent with ExtendTimeout 0", l)
		}
	}
}

func TestNotifierOptionsRejectNegatives(t *testing.T) {
	r := healthtest.NewRig(t, false)
	for _, tt := range []struct {
		field string
		opts  sdnotify.Options
	}{
		{"StatusInterval", sdnotify.Options{StatusInterval: -time.Second}},
		{"ExtendTimeout", sdnotify.Options{ExtendTimeout: -time.Second}},
		{"StartBudget", sdnotify.Options{StartBudget: -time.Second}},
	} {
		n, err := sdnotify.New(r.LC, tt.opts)
		if err == nil || !strings.Contains(err.Error(), tt.field) {
			t.Errorf("NewNotifier with a negative %s: %v, want an error naming it", tt.field, err)
		}
		if n != nil {
			n.Close()
		}
	}
}

// WATCHDOG=1 is sent only while the liveness check passes within its
// deadline, which is shorter than the half period between checks.
func TestNotifierWatchdogFollowsLiveness(t *testing.T) {
	ns := healthtest.ListenNotify(t)
	const watchdog = 100 * time.Millisecond
	t.Setenv("WATCHDOG_USEC", strconv.FormatInt(watchdog.Microseconds(), 10))
	t.Setenv("WATCHDOG_PID", strconv.Itoa(os.Getpid()))
	r := healthtest.NewRig(t, false)
	live := &liveness{failing: true}
	n, err := sdnotify.New(r.LC, sdnotify.Options{Alive: live.check, OnAliveError: live.report})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	watchdogs := func(lines []string) int {
		return len(slices.DeleteFunc(lines, func(l string) bool { return l != "WATCHDOG=1" }))
	}

	// Failing from the first check: not one WATCHDOG=1.
	healthtest.Eventually(t, "three failed checks", func() bool { return live.failed() >= 3 })
	if k := watchdogs(ns.BeforeMark(t)); k != 0 {
		t.Fatalf("%d WATCHDOG=1 while the check failed", k)
	}
	if err := n.AliveErr(); !errors.Is(err, errStuck) {
		t.Errorf("AliveErr() = %v, want it to wrap the check's error", err)
	}
	live.mu.Lock()
	if len(live.reported) < 3 || !errors.Is(live.reported[0], errStuck) {
		t.Errorf("OnAliveError got %v", live.reported)
	}
	for _, d := range live.deadlines {
		if d <= 0 || d > watchdog/2 {
			t.Errorf("a check's deadline was %v away, want within half the watchdog period (%v)", d, watchdog/2)
		}
	}
	live.failing = false
	live.mu.Unlock()

	// Passing: WATCHDOG=1 resumes.
	ns.WaitLine(t, "WATCHDOG=1 once the check passes", func(l string) bool { return l == "WATCHDOG=1" })
	healthtest.Eventually(t, "AliveErr to clear", func() bool { return n.AliveErr() == nil })

	// A check that overruns its deadline fails, whatever it returns.
	live.mu.Lock()
	live.hang = true
	live.mu.Unlock()
	f0 := live.failed()
	healthtest.Eventually(t, "two checks to overrun", func() bool { return live.failed() >= f0+2 })
	from := ns.Mark(t) // after it, only checks that began hanging
	healthtest.Eventually(t, "two more checks to overrun", func() bool { return live.failed() >= f0+4 })
	lines := ns.Snapshot()
	if k := watchdogs(lines[from:ns.Mark(t)]); k != 0 {
		t.Errorf("%d WATCHDOG=1 while the check overran its deadline", k)
	}
	if err := n.AliveErr(); err == nil || !strings.Contains(err.Error(), "took longer than") {
		t.Errorf("AliveErr() = %v, want the overrun", err)
	}
}

// errStuck is the error of liveness's failing check.
var errStuck = errors.New("port 5008 does not answer /livez")

// liveness is a liveness check the test steers: failing, or hanging until
// its deadline and then saying nothing is wrong; it keeps each check's
// time to its deadline and the errors reported to OnAliveError.
type liveness struct {
	mu        sync.Mutex
	failing   bool
	hang      bool
	checks    int // failed checks, counted as they return
	passed    int
	deadlines []time.Duration // time left to each check's deadline
	reported  []error
}

// check is the Notifier's Alive.
func (l *liveness) check(ctx context.Context) error {
	l.mu.Lock()
	dl, ok := ctx.Deadline()
	if ok {
		l.deadlines = append(l.deadlines, time.Until(dl))
	} else {
		l.deadlines = append(l.deadlines, -1)
	}
	f, h := l.failing, l.hang
	l.mu.Unlock()
	if h {
		<-ctx.Done() // a check that hangs until its deadline, then says nothing is wrong
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if f || h {
		l.checks++
		if h {
			return nil
		}
		return errStuck
	}
	l.passed++
	return nil
}

// report is the Notifier's OnAliveError.
func (l *liveness) report(err error) {
	l.mu.Lock()
	l.reported = append(l.reported, err)
	l.mu.Unlock()
}

// failed is how many checks failed so far.
func (l *liveness) failed() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.checks
}

// stepper is a lifecycle whose one phase, reclaim, counts one namespace
// each time the test sends on step, and reports nothing in between.
func stepper(t *testing.T) (lc *lifecycle.Lifecycle, step chan<- struct{}) {
	t.Helper()
	steps := make(chan struct{})
	lc, err := lifecycle.New([]lifecycle.Phase{{
		Name: "reclaim",
		Run: func(ctx context.Context, p *lifecycle.Progress) error {
			p.SetTotal(1000, "namespaces")
			for {
				select {
				case <-steps:
					p.Add(1)
				case <-ctx.Done():
					return ctx.Err()
				}
			}
		},
	}}, lifecycle.WithProgressInterval(time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lc.Drain(context.Background()) })
	return lc, steps
}

func extendLines(lines []string) []string {
	return slices.DeleteFunc(lines, func(l string) bool { return !strings.HasPrefix(l, "EXTEND_TIMEOUT_USEC=") })
}

// EXTEND_TIMEOUT_USEC follows progress: a start stuck for longer than the
// extension stops asking, so systemd's TimeoutStartSec can end it; the
// asking resumes with the progress.
func TestNotifierExtendsOnlyWhileStartProgresses(t *testing.T) {
	ns := healthtest.ListenNotify(t)
	const extend = 60 * time.Millisecond // asked again at most every 20 ms
	lc, step := stepper(t)
	n, err := sdnotify.New(lc, sdnotify.Options{ExtendTimeout: extend})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	go func() { _ = lc.Start(context.Background()) }()
	ns.WaitLine(t, "EXTEND_TIMEOUT_USEC", func(l string) bool { return l == "EXTEND_TIMEOUT_USEC=60000" })

	// Stuck for 20 extensions: a timer would have asked 60 times more. The
	// start itself (starting, reclaim running, its total) is at most 3
	// changes, so at most 3 extensions.
	time.Sleep(20 * extend)
	stuck := extendLines(ns.BeforeMark(t))
	if len(stuck) > 3 {
		t.Fatalf("%d extensions while the start made no progress for %v: %q", len(stuck), 20*extend, stuck)
	}

	// Progress: asked again.
	step <- struct{}{}
	ns.WaitLine(t, "an extension after progress", func(string) bool { return len(extendLines(ns.Snapshot())) > len(stuck) })
	// And stuck again: at most one more for that step.
	time.Sleep(20 * extend)
	if again := extendLines(ns.BeforeMark(t)); len(again) > len(stuck)+1 {
		t.Errorf("%d extensions after one step and a stuck start, want at most %d: %q", len(again), len(stuck)+1, again)
	}
}

// With a start budget, one EXTEND_TIMEOUT_USEC asks for exactly what is
// left of it, whatever the progress, and nothing beyond it is ever asked.
func TestNotifierStartBudget(t *testing.T) {
	t.Run("budget left", func(t *testing.T) {
		ns := healthtest.ListenNotify(t)
		const budget = time.Hour
		lc, step := stepper(t)
		n, err := sdnotify.New(lc, sdnotify.Options{ExtendTimeout: 60 * time.Millisecond, StartBudget: budget})
		if err != nil {
			t.Fatal(err)
		}
		defer n.Close()
		before := time.Now()
		go func() { _ = lc.Start(context.Background()) }()
		ns.WaitLine(t, "EXTEND_TIMEOUT_USEC", func(l string) bool { return strings.HasPrefix(l, "EXTEND_TIMEOUT_USEC=") })
		elapsed := time.Since(before)
		for range 5 {
			step <- struct{}{}
		}
		time.Sleep(300 * time.Millisecond) // five extension periods of 60 ms
		lines := extendLines(ns.BeforeMark(t))
		if len(lines) != 1 {
			t.Fatalf("extensions %q, want exactly one", lines)
		}
		usec, err := strconv.ParseInt(strings.TrimPrefix(lines[0], "EXTEND_TIMEOUT_USEC="), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		if got := time.Duration(usec) * time.Microsecond; got > budget || got < budget-elapsed {
			t.Errorf("asked for %v, want what is left of %v after at most %v: in [%v, %v]", got, budget, elapsed, budget-elapsed, budget)
		}
	})
	t.Run("budget spent", func(t *testing.T) {
		ns := healthtest.ListenNotify(t)
		lc, _ := stepper(t)
		n, err := sdnotify.New(lc, sdnotify.Options{ExtendTimeout: time.Minute, StartBudget: time.Nanosecond})
		if err != nil {
			t.Fatal(err)
		}
		defer n.Close()
		go func() { _ = lc.Start(context.Background()) }()
		ns.WaitLine(t, "saying starting", func(l string) bool { return strings.HasPrefix(l, "STATUS=starting") })
		if lines := extendLines(ns.BeforeMark(t)); len(lines) != 0 {
			t.Errorf("asked for %q beyond a spent budget", lines)
		}
	})
}
