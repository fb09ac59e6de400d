package app

import (
	"errors"
	"fmt"
	"slices"

	"github.com/phasegate/phasegate/lifecycle"
)

// ReservedPhaseError reports a phase named like one of the App's own,
// [PhaseListen] or [PhaseServe]: New adds those itself.
type ReservedPhaseError struct {
	Name string
}

func (e *ReservedPhaseError) Error() string {
	return fmt.Sprintf("phase %q: the name is reserved by the App, which adds a phase of that name itself", e.Name)
}

// ServeDependencyError reports a phase that depends on [PhaseServe]: serve
// is the App's last phase, after every other, so nothing may depend on it.
// Work that must wait for serving belongs in a background task deferred by
// a phase, or after [App.Start] returns.
type ServeDependencyError struct {
	Phase string
}

func (e *ServeDependencyError) Error() string {
	return fmt.Sprintf("phase %q depends on %q: nothing may depend on serve, the App's last phase, which runs after every other", e.Phase, PhaseServe)
}

// checkPhases reports, joined, the phases that clash with the App's own:
// the lifecycle would report them as a duplicate name or a cycle, which
// does not say what is wrong.
func checkPhases(phases []lifecycle.Phase) error {
	var errs []error
	for _, p := range phases {
		if p.Name == PhaseListen || p.Name == PhaseServe {
			errs = append(errs, &ReservedPhaseError{Name: p.Name})
		}
		if slices.Contains(p.DependsOn, PhaseServe) {
			errs = append(errs, &ServeDependencyError{Phase: p.Name})
		}
	}
	return errors.Join(errs...)
}

// The exit codes of [App.Main] and [ExitCode]: a supervisor's contract.
const (
	// ExitOK: an orderly stop (a signal, [App.Shutdown], a drain during
	// the start).
	ExitOK = 0
	// ExitFailure: a failure that a restart may cure (a dependency
	// unreachable, a start that timed out, a failure after serving).
	ExitFailure = 1
	// ExitConfig: a configuration error, which no restart cures: an error
	// of [New], a phase's error marked with [BadConfig], or a phase policy
	// its PolicyFrom could not give. systemd stops restarting on it with
	// RestartPreventExitStatus=2.
	ExitConfig = 2
)

// BadConfig marks err as a configuration error: the phase that returns
// it is not retried ([lifecycle.Permanent]), and [App.Main] exits
// [ExitConfig] for it. err keeps its message and its chain; errors.Is
// sees [ErrConfig] through it. BadConfig(nil) is nil.
//
//	n, err := strconv.Atoi(flags.entries)
//	if err != nil {
//		return app.BadConfig(fmt.Errorf("-cache-entries %q: %w", flags.entries, err))
//	}
func BadConfig(err error) error {
	if err == nil {
		return nil
	}
	return lifecycle.Permanent(&configError{err: err})
}

// configError is an error marked by BadConfig.
type configError struct{ err error }

func (e *configError) Error() string        { return e.err.Error() }
func (e *configError) Unwrap() error        { return e.err }
func (e *configError) Is(target error) bool { return target == ErrConfig }

// ExitCode is the exit code for err, the error of [New] or of [App.Run]:
// [ExitOK] for nil, [ExitConfig] for a configuration error (errors.Is
// [ErrConfig], or a [*lifecycle.PolicyError]), [ExitFailure] for any
// other.
//
//	a, err := app.New(cfg, phases...)
//	if err != nil {
//		fmt.Fprintln(os.Stderr, err)
//		os.Exit(app.ExitCode(err))
//	}
//	os.Exit(a.Main())
func ExitCode(err error) int {
	switch {
	case err == nil:
		return ExitOK
	case errors.Is(err, ErrConfig), errors.As(err, new(*lifecycle.PolicyError)):
		return ExitConfig
	}
	return ExitFailure
}
