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
