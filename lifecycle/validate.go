package lifecycle

import (
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
			errs = append(errs, declarationError("", "phase #%d has an empty name", i))
			continue
		case strings.TrimSpace(p.Name) != p.Name || strings.ContainsAny(p.Name, "\x00\n\r\t"):
			errs = append(errs, invalidPhase(p.Name, "name has surrounding space or control characters"))
		}
		if _, dup := index[p.Name]; dup {
			errs = append(errs, declarationError(p.Name, "phase %q is declared more than once", p.Name))
			continue
		}
		index[p.Name] = i
	}
	for _, p := range phases {
		if p.Name == "" {
			continue
		}
		if p.Run == nil {
			errs = append(errs, invalidPhase(p.Name, "Run is nil"))
		}
		for _, problem := range (AttemptBounds{Timeout: p.Timeout, Retry: p.Retry}).problems() {
			errs = append(errs, invalidPhase(p.Name, problem))
		}
		if p.PolicyFrom != nil && (p.Timeout != 0 || p.Retry != RetryPolicy{}) {
			errs = append(errs, invalidPhase(p.Name, "Timeout or Retry set beside PolicyFrom, which gives them"))
		}
		if p.StopTimeout < 0 {
			errs = append(errs, invalidPhase(p.Name, "negative StopTimeout"))
		}
		seen := make(map[string]bool, len(p.DependsOn))
		for _, d := range p.DependsOn {
			switch _, known := index[d]; {
			case d == p.Name:
				errs = append(errs, declarationError(p.Name, "phase %q depends on itself", p.Name))
			case !known:
				errs = append(errs, declarationError(p.Name, "phase %q depends on unknown phase %q", p.Name, d))
			case seen[d]:
				errs = append(errs, invalidPhase(p.Name, "depends on "+d+" twice"))
			}
			seen[d] = true
		}
	}
	for _, c := range findCycles(phases, index) {
		errs = append(errs, declarationError(c[0], "dependency cycle: %s", strings.Join(c, " -> ")))
	}
	return errs
}

// invalidPhase is a phase whose fields cannot be used.
func invalidPhase(phase, reason string) *DeclarationError {
	return declarationError(phase, "phase %q: %s", phase, reason)
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
