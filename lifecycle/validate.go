package lifecycle

import (
	"math"
	"slices"
	"strings"
)

// validate checks a declaration and returns every problem found.
func validate(phases []Phase) []error {
	var errs []error
	index := make(map[string]int, len(phases))
	for i, p := range phases {
		switch {
		case p.Name == "":
			errs = append(errs, &EmptyNameError{Index: i})
			continue
		case strings.TrimSpace(p.Name) != p.Name || strings.ContainsAny(p.Name, "\x00\n\r\t"):
			errs = append(errs, &InvalidPhaseError{Phase: p.Name, Reason: "name has surrounding space or control characters"})
		}
		if _, dup := index[p.Name]; dup {
			errs = append(errs, &DuplicateNameError{Name: p.Name})
			continue
		}
		index[p.Name] = i
	}
	for _, p := range phases {
		if p.Name == "" {
			continue
		}
		if p.Run == nil {
			errs = append(errs, &InvalidPhaseError{Phase: p.Name, Reason: "Run is nil"})
		}
		if p.Timeout < 0 {
			errs = append(errs, &InvalidPhaseError{Phase: p.Name, Reason: "negative Timeout"})
		}
		if p.StopTimeout < 0 {
			errs = append(errs, &InvalidPhaseError{Phase: p.Name, Reason: "negative StopTimeout"})
		}
		if p.Retry.Backoff < 0 || p.Retry.MaxBackoff < 0 {
			errs = append(errs, &InvalidPhaseError{Phase: p.Name, Reason: "negative retry backoff"})
		}
		if p.Retry.Attempts < 0 {
			errs = append(errs, &InvalidPhaseError{Phase: p.Name, Reason: "negative retry attempts"})
		}
		if m := p.Retry.Multiplier; m != 0 && !(m >= 1 && !math.IsInf(m, 1)) { // also NaN
			errs = append(errs, &InvalidPhaseError{Phase: p.Name, Reason: "retry multiplier below 1 or not finite"})
		}
		if j := p.Retry.Jitter; !(j >= 0 && j <= 1) {
			errs = append(errs, &InvalidPhaseError{Phase: p.Name, Reason: "retry jitter outside [0, 1]"})
		}
		seen := make(map[string]bool, len(p.DependsOn))
		for _, d := range p.DependsOn {
			switch _, known := index[d]; {
			case d == p.Name:
				errs = append(errs, &SelfDependencyError{Phase: p.Name})
			case !known:
				errs = append(errs, &UnknownDependencyError{Phase: p.Name, Dependency: d})
			case seen[d]:
				errs = append(errs, &InvalidPhaseError{Phase: p.Name, Reason: "depends on " + d + " twice"})
			}
			seen[d] = true
		}
	}
	for _, c := range findCycles(phases, index) {
		errs = append(errs, &CycleError{Path: c})
	}
	return errs
}

// findCycles returns one path per cycle reachable by depth-first search over
// the known, non-self dependencies. Each cycle is reported once, rotated to
// start at its phase declared first.
func findCycles(phases []Phase, index map[string]int) [][]string {
	const (
		white = iota
		grey
		black
	)
	color := make([]int, len(phases))
	var stack []int
	var cycles [][]string
	seen := map[string]bool{}

	var visit func(i int)
	visit = func(i int) {
		color[i] = grey
		stack = append(stack, i)
		for _, d := range phases[i].DependsOn {
			j, ok := index[d]
			if !ok || j == i || phases[j].Name != d {
				continue
			}
			switch color[j] {
			case white:
				visit(j)
			case grey:
				at := slices.Index(stack, j)
				cyc := slices.Clone(stack[at:])
				// Rotate so the earliest-declared phase leads: the same cycle
				// found from another entry point is then spelled the same.
				m := slices.Index(cyc, slices.Min(cyc))
				cyc = append(cyc[m:], cyc[:m]...)
				names := make([]string, 0, len(cyc)+1)
				for _, k := range cyc {
					names = append(names, phases[k].Name)
				}
				names = append(names, names[0])
				if key := strings.Join(names, "\x00"); !seen[key] {
					seen[key] = true
					cycles = append(cycles, names)
				}
			}
		}
		stack = stack[:len(stack)-1]
		color[i] = black
	}
	for i, p := range phases {
		if p.Name != "" && color[i] == white && index[p.Name] == i {
			visit(i)
		}
	}
	return cycles
}
