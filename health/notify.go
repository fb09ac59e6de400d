package health

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"

	"github.com/phasegate/phasegate/lifecycle"
)

// NotifierOptions configure a [Notifier]. Zero durations mean what they
// say (no limit, no extension) and negative ones are refused by
// [NewNotifier]; [DefaultNotifierOptions] has the recommended values.
type NotifierOptions struct {
	// StatusInterval is the least time between two STATUS= lines that only
	// report progress; the latest one is sent when it ends. State changes
	// are sent at once. Zero means no limit: every progress report the
	// notifier sees is sent. Recommended: 1s.
	StatusInterval time.Duration
	// ExtendTimeout is the time asked for with EXTEND_TIMEOUT_USEC= while
	// starting. It is asked for again every third of it, so a long start
	// is not killed by TimeoutStartSec while phases make their way; what
	// bounds a stuck start is then the phases' own timeouts. Zero means
	// never to ask: systemd's TimeoutStartSec alone bounds the start.
	// Recommended: 30s.
	ExtendTimeout time.Duration

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

// DefaultNotifierOptions returns the recommended options.
func DefaultNotifierOptions() NotifierOptions {
	return NotifierOptions{
		StatusInterval: time.Second,
		ExtendTimeout:  30 * time.Second,
	}
}

func (o NotifierOptions) validate() error {
	var errs []error
	for _, f := range []struct {
		name string
		d    time.Duration
	}{
		{"StatusInterval", o.StatusInterval},
		{"ExtendTimeout", o.ExtendTimeout},
	} {
		if f.d < 0 {
			errs = append(errs, fmt.Errorf("health: NotifierOptions.%s is %v, must not be negative (zero means none)", f.name, f.d))
		}
	}
	return errors.Join(errs...)
}

// Notifier tells systemd how a lifecycle is doing, over the sd_notify
// protocol (through github.com/coreos/go-systemd/v22/daemon):
//
//	starting  STATUS=starting: phase reclaim 1200/5000 namespaces   (rate-limited;
//	          with "(812/s, ~4.7s left)" once the phase's rate is known)
//	          EXTEND_TIMEOUT_USEC=…                                  (re-sent while starting)
//	serving   READY=1, STATUS=serving
//	draining  STOPPING=1, STATUS=draining
//	failed    STATUS=failed: …
//	always    WATCHDOG=1 every half of WATCHDOG_USEC while the liveness check
//	          passes, unless failed
//
// WATCHDOG=1 is sent only on evidence: the lifecycle answered and
// [NotifierOptions.Alive] passed within a quarter of WatchdogSec. A daemon
// whose checks fail, or hang, stops sending it and systemd restarts it.
// With checks every half period, each bounded by a quarter, two pings are
// never more than three quarters of WatchdogSec apart while the checks
// pass.
//
// The socket and the watchdog come from the environment (NOTIFY_SOCKET,
// WATCHDOG_USEC, WATCHDOG_PID) as systemd sets it. Without NOTIFY_SOCKET a
// Notifier does nothing and runs no goroutine.
type Notifier struct {
	lc       *lifecycle.Lifecycle
	opts     NotifierOptions
	watchdog time.Duration
	stop     func()         // ends the subscription and the watchdog's checks
	wg       sync.WaitGroup // the notifier's goroutines
	done     chan struct{}  // closed once they returned

	mu       sync.Mutex
	err      error
	aliveErr error
}

// NewNotifier starts notifying systemd about lc, when NOTIFY_SOCKET is set.
// The goroutine it starts is stopped by [Notifier.Close]. It fails when opts
// are invalid or WATCHDOG_USEC or WATCHDOG_PID cannot be parsed.
func NewNotifier(lc *lifecycle.Lifecycle, opts NotifierOptions) (*Notifier, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	n := &Notifier{lc: lc, opts: opts, done: make(chan struct{})}
	if os.Getenv("NOTIFY_SOCKET") == "" {
		n.stop = func() {}
		close(n.done)
		return n, nil
	}
	wd, err := daemon.SdWatchdogEnabled(false)
	if err != nil {
		return nil, fmt.Errorf("health: sd_notify watchdog: %w", err)
	}
	n.watchdog = wd
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
	go func() {
		n.wg.Wait()
		close(n.done)
	}()
	return n, nil
}

// Enabled reports whether the notifier talks to systemd.
func (n *Notifier) Enabled() bool {
	select {
	case <-n.done:
		return false
	default:
		return true
	}
}

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
	n.stop()
	<-n.done
}

func (n *Notifier) send(lines ...string) {
	if _, err := daemon.SdNotify(false, strings.Join(lines, "\n")); err != nil {
		n.mu.Lock()
		n.err = fmt.Errorf("health: sd_notify: %w", err)
		n.mu.Unlock()
	}
}

func (n *Notifier) extendLine() string {
	return "EXTEND_TIMEOUT_USEC=" + strconv.FormatInt(n.opts.ExtendTimeout.Microseconds(), 10)
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
	var (
		extend  *time.Ticker
		extendC <-chan time.Time
	)
	if n.opts.ExtendTimeout > 0 {
		extend = time.NewTicker(n.opts.ExtendTimeout / 3)
		defer extend.Stop()
		extendC = extend.C
	}
	eta := lifecycle.NewEstimator(lifecycle.DefaultETAWindow, lifecycle.DefaultETAMinSpan)
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
			desc := DescribeWithETA(s, eta.Observe(s, time.Now()))
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
				if s.State == lifecycle.StateStarting && extend != nil {
					lines = append(lines, n.extendLine())
					extend.Reset(n.opts.ExtendTimeout / 3)
				}
				n.send(lines...)
				setStatus(desc)
				continue
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
		case <-extendC:
			if state == lifecycle.StateStarting {
				n.send(n.extendLine())
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
		return false, fmt.Errorf("health: liveness check: %w", err)
	}
	return false, nil
}
