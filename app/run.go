package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/phasegate/phasegate/internal/memlimit"
)

// Run starts the App and blocks until it is told to stop, then stops it:
//
//   - SIGINT, SIGTERM or SIGHUP, or [App.Shutdown], or ctx ending: an
//     orderly drain; Run returns nil when it completes;
//   - the same during the start: the start is cut short and drained, in
//     milliseconds when the App never served (no drain delay is spent on
//     a port that never served); the log reads "draining during startup"
//     with the signal or reason, the lifecycle turning draining from
//     starting, each phase that was running ending cancelled, at INFO,
//     with reason "lifecycle: drained during the start" (an orderly stop,
//     not an error), each pending one skipped, the stops of the phases
//     that had succeeded, then "stopped"; Run returns nil;
//   - a second signal during the drain: the waits are cut short, and so
//     they are when the drain outlasts [App.StopBudget];
//   - a start that fails: Run returns its error after the rollback;
//   - a failure after serving (the port's listener dies, or
//     [lifecycle.Lifecycle.Fail]): the lifecycle turns failed, health says
//     so, the App drains and Run returns the cause, so that the process
//     exits non-zero and its supervisor restarts it.
//
// In a cgroup with a memory limit (a container's, a Nomad task's, a
// systemd unit's MemoryMax=) Run first gives the Go runtime 90% of it as
// its soft limit, unless GOMEMLIMIT says otherwise: the heap is collected
// harder near the limit instead of the process being killed at it.
func (a *App) Run(ctx context.Context) error {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	return a.run(ctx, sigs)
}

// Main runs the App on the process's signals and returns the exit code
// ([ExitCode]): 0 after an orderly stop (a signal, [App.Shutdown], a drain
// during the start included); 2 when a phase failed with a configuration
// error ([BadConfig]), which no restart cures; 1 after any other failure
// (a start that failed or timed out, a failure after serving, a drain
// that failed or was cut short, an upgrade whose exec failed). A failure
// is logged as "exiting after a failure" with its exit code. A successful
// upgrade does not return: the process is the new image. An error from
// [New] happens before Main: exit with ExitCode(err), which is 2.
func (a *App) Main() int {
	err := a.Run(context.Background())
	code := ExitCode(err)
	if err != nil {
		a.log.Error("exiting after a failure", append(a.failureAttrs(err), "exit_code", code)...)
	}
	return code
}

// failureAttrs are what the App's own lines about a failure ("startup
// failed", "exiting after a failure") say of err: the phase whose failure
// it is, or nothing when the lifecycle's line said it; the error itself
// only when no line did. Each failure is logged once (logging.go).
func (a *App) failureAttrs(err error) []any {
	if name := failedPhase(err); name != "" {
		return []any{"phase", name}
	}
	if s := a.lc.Snapshot(); s.Err != nil && errors.Is(err, s.Err) {
		return nil
	}
	return []any{"error", err}
}

func (a *App) run(ctx context.Context, sigs <-chan os.Signal) error {
	defer a.close()
	applyMemoryLimit(a.log, memlimit.Host())
	started := make(chan error, 1)
	go func() { started <- a.Start(ctx) }()
	cause, startReturned := a.untilStop(ctx, sigs, started)
	upgrade := errors.Is(cause, errUpgrade)
	if upgrade {
		cause = nil
		a.mu.Lock()
		a.upgrading = true
		a.mu.Unlock()
	}
	drainErr, interrupted := a.drain(ctx, sigs)
	if !startReturned {
		<-started // returns at once: Drain waited for the start to end
	}
	if drainErr != nil {
		attrs := []any{"error", drainErr}
		if stack := PanicStack(drainErr); stack != "" {
			attrs = append(attrs, "stack", stack)
		}
		a.log.Error("drain", attrs...)
	}
	if upgrade && interrupted == nil {
		// The drain's errors do not stop an upgrade: what the new image
		// needs is durable, and it reclaims whatever was left.
		a.close()
		return a.execUpgrade()
	}
	if upgrade {
		a.log.Warn("upgrade abandoned: the drain was cut short", "cause", interrupted.Error())
		a.mu.Lock()
		a.upgradeIn.close()
		a.upgradeIn = nil
		a.mu.Unlock()
	}
	if cause == nil && drainErr != nil {
		cause = fmt.Errorf("drain: %w", drainErr)
	}
	if cause == nil {
		a.logCaughtUp()
		a.log.Info("stopped")
	}
	return cause
}

// untilStop waits through the start (started is its outcome) and then,
// once serving, for a reason to stop: a signal, Shutdown, ctx's end, or
// a failure, which it returns as cause ([errUpgrade] for an upgrade).
// startReturned says whether the start had ended.
func (a *App) untilStop(ctx context.Context, sigs <-chan os.Signal, started <-chan error) (cause error, startReturned bool) {
	for {
		select {
		case err := <-started:
			a.logCaughtUp()
			if err != nil {
				a.log.Error("startup failed", a.failureAttrs(err)...)
				return err, true
			}
			a.log.Info("serving", "addr", addrString(a.Addr(ctx)), "startup", time.Since(a.lc.Snapshot().Started).Round(time.Millisecond).String())
			return a.serving(ctx, sigs), true
		case sig := <-sigs:
			a.logCaughtUp() // the signal came after what was logged so far
			if sig == syscall.SIGHUP && a.cfg.UpgradeOnHangup {
				a.log.Warn("SIGHUP during the start: upgrade refused; send it again once serving")
				continue
			}
			a.log.Info("draining during startup", "signal", sig.String())
			return nil, false
		case <-a.quit:
			a.logCaughtUp()
			a.log.Info("draining during startup", "reason", "shutdown requested")
			return nil, false
		case <-ctx.Done():
			a.logCaughtUp()
			a.log.Info("draining during startup", "reason", context.Cause(ctx).Error())
			return nil, false
		}
	}
}

// drain drains the lifecycle within the stop budget; a second signal cuts
// it short: every wait of the stop functions sees its context end. It
// returns the drain's error and, when it was cut short, why.
func (a *App) drain(ctx context.Context, sigs <-chan os.Signal) (drainErr, interrupted error) {
	drainCtx, cutShort := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cutShort(nil)
	if a.stopBudget > 0 {
		var cancel context.CancelFunc
		drainCtx, cancel = context.WithTimeoutCause(drainCtx, a.stopBudget,
			fmt.Errorf("stop budget of %v spent", a.stopBudget))
		defer cancel()
	}
	go func() {
		for {
			select {
			case sig := <-sigs:
				if sig == syscall.SIGHUP && a.cfg.UpgradeOnHangup {
					a.log.Warn("SIGHUP during a drain or an upgrade: refused")
					continue
				}
				a.log.Warn("second signal: stopping now", "signal", sig.String())
				cutShort(fmt.Errorf("second signal %s", sig))
				return
			case <-drainCtx.Done():
				return
			}
		}
	}()
	drainErr = a.lc.Drain(drainCtx)
	interrupted = context.Cause(drainCtx)
	cutShort(nil)
	return drainErr, interrupted
}

// serving waits, while the App serves, for a reason to stop, and returns
// the failure when that reason is one ([errUpgrade] for an upgrade).
func (a *App) serving(ctx context.Context, sigs <-chan os.Signal) error {
	for {
		select {
		case sig := <-sigs:
			if sig == syscall.SIGHUP && a.cfg.UpgradeOnHangup {
				if a.prepareUpgrade(ctx) {
					return errUpgrade
				}
				continue
			}
			a.log.Info("draining", "signal", sig.String())
			return nil
		case <-a.quit:
			a.log.Info("draining", "reason", "shutdown requested")
			return nil
		case <-ctx.Done():
			a.log.Info("draining", "reason", context.Cause(ctx).Error())
			return nil
		case <-a.srv.Done():
			err := a.srv.Err()
			if err == nil {
				err = errors.New("the server stopped serving")
			}
			if ferr := a.lc.Fail(err); ferr != nil {
				a.log.Warn("marking the lifecycle failed", "error", ferr)
			}
			a.log.Error("failure after serving: draining", "error", err)
			return err
		case <-a.lc.Done(): // serving ends here only by a failure
			err := a.lc.Err()
			if err == nil {
				err = errors.New("lifecycle failed")
			}
			a.log.Error("failure after serving: draining", "error", err)
			return err
		}
	}
}

// logCaughtUp waits until the log hook has written every lifecycle event
// recorded so far, so that the App's own line about an outcome ("serving",
// "startup failed", "stopped") comes after the phase and lifecycle lines
// that led to it: the hook runs on its own goroutine, behind. A log writer
// that blocks does not hold the App up for more than a bound.
func (a *App) logCaughtUp() {
	want := a.lc.Snapshot().EventSeq
	bound := time.NewTimer(2 * time.Second)
	defer bound.Stop()
	for {
		a.mu.Lock()
		if a.loggedSeq >= want {
			a.mu.Unlock()
			return
		}
		if a.logWake == nil {
			a.logWake = make(chan struct{})
		}
		wake := a.logWake
		a.mu.Unlock()
		select {
		case <-wake:
		case <-bound.C:
			return
		}
	}
}

func addrString(a net.Addr) string {
	if a == nil {
		return ""
	}
	return a.String()
}
