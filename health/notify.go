package health

import (
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
//	always    WATCHDOG=1 every half of WATCHDOG_USEC, unless failed
//
// The socket and the watchdog come from the environment (NOTIFY_SOCKET,
// WATCHDOG_USEC, WATCHDOG_PID) as systemd sets it. Without NOTIFY_SOCKET a
// Notifier does nothing and runs no goroutine.
type Notifier struct {
	opts     NotifierOptions
	watchdog time.Duration
	stop     func()
	done     chan struct{}

	mu  sync.Mutex
	err error
}

// NewNotifier starts notifying systemd about lc, when NOTIFY_SOCKET is set.
// The goroutine it starts is stopped by [Notifier.Close]. It fails when opts
// are invalid or WATCHDOG_USEC or WATCHDOG_PID cannot be parsed.
func NewNotifier(lc *lifecycle.Lifecycle, opts NotifierOptions) (*Notifier, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	n := &Notifier{opts: opts, done: make(chan struct{})}
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
	ch, cancel := lc.Subscribe()
	n.stop = cancel
	go n.run(ch)
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

// Close stops the notifier and waits for its goroutine. It is idempotent.
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
	defer close(n.done)

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
	var watchdog <-chan time.Time
	if n.watchdog > 0 {
		t := time.NewTicker(n.watchdog / 2)
		defer t.Stop()
		watchdog = t.C
		n.send(daemon.SdNotifyWatchdog)
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
		case <-watchdog:
			if state != lifecycle.StateFailed {
				n.send(daemon.SdNotifyWatchdog)
			}
		}
	}
}
