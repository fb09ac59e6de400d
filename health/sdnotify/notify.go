package sdnotify

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"

	"github.com/phasegate/phasegate/health"
	"github.com/phasegate/phasegate/lifecycle"
)

// Options configure a [Notifier]. Zero durations mean what they
// say (no limit, no extension) and negative ones are refused by
// [New]; [DefaultOptions] has the recommended values.
type Options struct {
	// StatusInterval is the least time between two STATUS= lines that only
	// report progress; the latest one is sent when it ends. State changes
	// are sent at once. Zero means no limit: every progress report the
	// notifier sees is sent. Recommended: 1s.
	StatusInterval time.Duration
	// ExtendTimeout is the time EXTEND_TIMEOUT_USEC= asks for while
	// starting, each time the start made progress: when the lifecycle
	// starts, and again, at most every third of it, once a phase changed
	// state or its progress moved since the last request. A long start
	// that makes its way is not killed by TimeoutStartSec; a start stuck
	// for longer than ExtendTimeout asks no more, and systemd ends it once
	// it has also run longer than TimeoutStartSec. Zero means never to ask:
	// TimeoutStartSec alone bounds the start. Ignored when StartBudget is
	// set. Recommended: 30s.
	ExtendTimeout time.Duration
	// StartBudget, when positive, is how long the daemon lets its start
	// take: its own start timeout plus what a rollback after it may take.
	// One EXTEND_TIMEOUT_USEC= when the lifecycle starts asks for exactly
	// what is left of it, progress or not, and none other is sent, so
	// systemd steps in only if the daemon's own bound did not end the
	// start; its bound is then the larger of TimeoutStartSec and the
	// budget. Zero means no budget: ExtendTimeout's progress rule applies.
	StartBudget time.Duration

	// Alive, when set, is the daemon's proof of life, checked before each
	// WATCHDOG=1: a self-probe such as its own port answering /livez. It is
	// called every half of systemd's WatchdogSec with a ctx whose deadline
	// is a quarter of it, and must return by then; WATCHDOG=1 is sent only
	// when it returned nil in time. Before it, the notifier checks that the
	// lifecycle answers (its lock is not stuck). Unused without a watchdog.
	Alive func(ctx context.Context) error
	// OnAliveError, when set, is called with each failed check's error,
	// from the notifier's watchdog goroutine: the daemon logs it. systemd
	// acts on the missing WATCHDOG=1 by itself.
	OnAliveError func(err error)
}

// DefaultOptions returns the recommended options.
func DefaultOptions() Options {
	return Options{
		StatusInterval: time.Second,
		ExtendTimeout:  30 * time.Second,
	}
}

func (o Options) validate() error {
	var errs []error
	for _, f := range []struct {
		name string
		d    time.Duration
	}{
		{"StatusInterval", o.StatusInterval},
		{"ExtendTimeout", o.ExtendTimeout},
		{"StartBudget", o.StartBudget},
	} {
		if f.d < 0 {
			errs = append(errs, fmt.Errorf("sdnotify: Options.%s is %v, must not be negative (zero means none)", f.name, f.d))
		}
	}
	return errors.Join(errs...)
}

// Notifier tells systemd how a lifecycle is doing, over the sd_notify
// protocol (through github.com/coreos/go-systemd/v22/daemon):
//
//	starting  STATUS=starting: phase reclaim 1200/5000 namespaces   (rate-limited;
//	          with "(812/s, ~4.7s left)" once the phase's rate is known)
//	          EXTEND_TIMEOUT_USEC=…                                  (re-sent while the start
//	          makes progress, or once for a start budget)
//	serving   READY=1, STATUS=serving
//	draining  STOPPING=1, STATUS=draining
//	failed    STATUS=failed: …
//	always    WATCHDOG=1 every half of WATCHDOG_USEC while the liveness check
//	          passes, unless failed
//
// WATCHDOG=1 is sent only on evidence: the lifecycle answered and
// [Options.Alive] passed within a quarter of WatchdogSec. A daemon
// whose checks fail, or hang, stops sending it and systemd restarts it.
// With checks every half period, each bounded by a quarter, two pings are
// never more than three quarters of WatchdogSec apart while the checks
// pass.
//
// The socket and the watchdog come from the environment (NOTIFY_SOCKET,
// WATCHDOG_USEC, WATCHDOG_PID) as systemd sets it. Without NOTIFY_SOCKET a
// Notifier does nothing and runs no goroutine.
type Notifier struct {
	lc        *lifecycle.Lifecycle
	opts      Options
	watchdog  time.Duration
	enabled   bool
	stop      func()         // ends the subscription and the watchdog's checks
	wg        sync.WaitGroup // the notifier's goroutines
	closeOnce sync.Once
	closed    atomic.Bool

	mu       sync.Mutex
	err      error
	aliveErr error
}

// New starts notifying systemd about lc, when NOTIFY_SOCKET is set.
// The goroutines it starts, one for the lifecycle's changes and one for the
// watchdog when systemd asked for one, are stopped by [Notifier.Close]. It
// fails when opts are invalid or WATCHDOG_USEC or WATCHDOG_PID cannot be
// parsed.
func New(lc *lifecycle.Lifecycle, opts Options) (*Notifier, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	n := &Notifier{lc: lc, opts: opts, stop: func() {}}
	if os.Getenv("NOTIFY_SOCKET") == "" {
		return n, nil
	}
	wd, err := daemon.SdWatchdogEnabled(false)
	if err != nil {
		return nil, fmt.Errorf("sdnotify: sd_notify watchdog: %w", err)
	}
	n.watchdog, n.enabled = wd, true
	ch, unsubscribe := lc.Subscribe()
	ctx, cancel := context.WithCancel(context.Background())
	n.stop = func() {
		cancel()
		unsubscribe()
	}
	n.wg.Go(func() { n.run(ch) })
	if wd > 0 {
		n.wg.Go(func() { n.watch(ctx) })
	}
	return n, nil
}

// Enabled reports whether the notifier talks to systemd: NOTIFY_SOCKET is
// set and the notifier was not closed.
func (n *Notifier) Enabled() bool { return n.enabled && !n.closed.Load() }

// Err returns the last error met sending a notification, if any. Sending
// is best effort: an error never stops the notifier.
func (n *Notifier) Err() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.err
}

// AliveErr returns the error of the latest liveness check, or nil when it
// passed or none ran yet.
func (n *Notifier) AliveErr() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.aliveErr
}

// Close stops the notifier and waits for its goroutines. It is idempotent.
func (n *Notifier) Close() {
	n.closeOnce.Do(func() {
		n.stop()
		n.wg.Wait()
		n.closed.Store(true)
	})
}

func (n *Notifier) send(lines ...string) {
	if _, err := daemon.SdNotify(false, strings.Join(lines, "\n")); err != nil {
		n.mu.Lock()
		n.err = fmt.Errorf("sdnotify: sd_notify: %w", err)
		n.mu.Unlock()
	}
}

func (n *Notifier) run(ch <-chan lifecycle.Snapshot) {
	var (
		state        lifecycle.State // last state notified; "" before the first
		status       string          // last STATUS sent
		statusAt     time.Time
		pending      string // progress STATUS held back by the rate limit
		stoppingSent bool
	)
	limit := time.NewTimer(time.Hour)
	limit.Stop()
	defer limit.Stop()
	ext := newExtender(n.opts)
	defer ext.timer.Stop()
	setStatus := func(s string) {
		status, statusAt, pending = s, time.Now(), ""
		limit.Stop()
	}

	for {
		select {
		case s, ok := <-ch:
			if !ok {
				return
			}
			now := time.Now()
			desc := health.DescribeWithETA(s)
			if s.State != state {
				state = s.State
				var lines []string
				switch s.State {
				case lifecycle.StateServing:
					lines = append(lines, daemon.SdNotifyReady)
				case lifecycle.StateDraining, lifecycle.StateStopped:
					if !stoppingSent {
						lines = append(lines, daemon.SdNotifyStopping)
						stoppingSent = true
					}
				}
				lines = append(lines, "STATUS="+desc)
				if s.State == lifecycle.StateStarting {
					if l, ok := ext.start(s, now); ok {
						lines = append(lines, l)
					}
				} else {
					ext.stop()
				}
				n.send(lines...)
				setStatus(desc)
				continue
			}
			if s.State == lifecycle.StateStarting {
				if l, ok := ext.observe(s, now); ok {
					n.send(l)
				}
			}
			if desc == status {
				continue
			}
			if wait := n.opts.StatusInterval - time.Since(statusAt); wait > 0 {
				if pending == "" {
					limit.Reset(wait)
				}
				pending = desc
				continue
			}
			n.send("STATUS=" + desc)
			setStatus(desc)
		case <-limit.C:
			if pending != "" {
				n.send("STATUS=" + pending)
				setStatus(pending)
			}
		case <-ext.timer.C:
			if l, ok := ext.fire(time.Now()); ok && state == lifecycle.StateStarting {
				n.send(l)
			}
		}
	}
}

// watch checks liveness every half watchdog period, from the start, and
// sends WATCHDOG=1 after each check that passed.
func (n *Notifier) watch(ctx context.Context) {
	t := time.NewTicker(n.watchdog / 2)
	defer t.Stop()
	for {
		failed, err := n.checkAlive(ctx)
		if ctx.Err() != nil {
			return
		}
		n.mu.Lock()
		n.aliveErr = err
		n.mu.Unlock()
		switch {
		case err != nil:
			if f := n.opts.OnAliveError; f != nil {
				f(err)
			}
		case !failed:
			n.send(daemon.SdNotifyWatchdog)
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
	}
}

// checkAlive runs one liveness check: the lifecycle answers, and Alive
// passes within a quarter of the watchdog period. A failed lifecycle is not
// a failed check, but gets no WATCHDOG=1 either: it has nothing left to
// prove alive.
func (n *Notifier) checkAlive(ctx context.Context) (failed bool, err error) {
	// State takes the lifecycle's lock: a deadlocked lifecycle blocks here,
	// and so no WATCHDOG=1 is sent.
	if n.lc.State() == lifecycle.StateFailed {
		return true, nil
	}
	if n.opts.Alive == nil {
		return false, nil
	}
	budget := n.watchdog / 4
	ctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	err = n.opts.Alive(ctx)
	if err == nil && ctx.Err() != nil {
		err = fmt.Errorf("took longer than %v", budget)
	}
	if err != nil {
		return false, fmt.Errorf("sdnotify: liveness check: %w", err)
	}
	return false, nil
}

// extender decides when to send EXTEND_TIMEOUT_USEC= while starting: under
// a start budget, once, for what is left of it; otherwise each time the
// start made progress, at most every third of ExtendTimeout.
type extender struct {
	every  time.Duration // ExtendTimeout; 0: never
	budget time.Duration // StartBudget; 0: none

	last       time.Time   // when the last extension was sent
	marks      []phaseMark // the progress seen last
	progressed bool        // marks moved since the last extension
	timer      *time.Timer // fires every/3 after the last extension, when progressed
}

// phaseMark is what counts as progress in a phase: its state, its attempt
// and its reported progress.
type phaseMark struct {
	state    lifecycle.PhaseState
	attempts int
	progress lifecycle.ProgressSnapshot
}

func newExtender(o Options) *extender {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &extender{every: o.ExtendTimeout, budget: o.StartBudget, timer: t}
}

func extendLine(d time.Duration) string {
	return "EXTEND_TIMEOUT_USEC=" + strconv.FormatInt(d.Microseconds(), 10)
}

// start is the lifecycle entering starting: the first extension.
func (e *extender) start(s lifecycle.Snapshot, now time.Time) (string, bool) {
	if e.budget > 0 {
		left := s.Started.Add(e.budget).Sub(now)
		if s.Started.IsZero() || left <= 0 {
			return "", false
		}
		return extendLine(left), true
	}
	if e.every <= 0 {
		return "", false
	}
	e.marks = marksOf(s, e.marks[:0])
	return e.extend(now), true
}

// observe is a snapshot while starting: it extends at once when the start
// progressed and the last extension is a third of ExtendTimeout old, and
// otherwise sets the timer for then.
func (e *extender) observe(s lifecycle.Snapshot, now time.Time) (string, bool) {
	if e.budget > 0 || e.every <= 0 {
		return "", false
	}
	marks := marksOf(s, nil)
	if slices.Equal(marks, e.marks) {
		return "", false
	}
	e.marks = marks
	if !e.progressed {
		e.progressed = true
		if wait := e.last.Add(e.every / 3).Sub(now); wait > 0 {
			e.timer.Reset(wait)
			return "", false
		}
	}
	if now.Sub(e.last) < e.every/3 {
		return "", false // the timer is set
	}
	return e.extend(now), true
}

// fire is the timer: the start progressed since the last extension.
func (e *extender) fire(now time.Time) (string, bool) {
	if !e.progressed {
		return "", false
	}
	return e.extend(now), true
}

func (e *extender) extend(now time.Time) string {
	e.last, e.progressed = now, false
	e.timer.Stop()
	return extendLine(e.every)
}

// stop is the lifecycle leaving starting.
func (e *extender) stop() {
	e.progressed = false
	e.timer.Stop()
}

func marksOf(s lifecycle.Snapshot, buf []phaseMark) []phaseMark {
	for _, p := range s.Phases {
		buf = append(buf, phaseMark{p.State, p.Attempts, p.Progress})
	}
	return buf
}
