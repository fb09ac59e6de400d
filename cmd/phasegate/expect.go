package main

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/phasegate/phasegate/phases"
)

var phaseNames = []string{phases.PhaseLock, phases.PhaseListen, phases.PhaseReclaim, phases.PhaseStorage,
	phases.PhasePopulate, phases.PhaseRegister, phases.PhaseServe}

// expectValue is the --expect flag: "reclaim=2m,populate=30s". Phases it
// does not name keep their defaults; "reclaim=0" turns a warning off.
type expectValue struct{ m *map[string]time.Duration }

func (v expectValue) String() string {
	if v.m == nil {
		return ""
	}
	m := *v.m
	if m == nil {
		m = phases.DefaultExpected()
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, k+"="+m[k].String())
	}
	return strings.Join(parts, ",")
}

func (v expectValue) Set(s string) error {
	m := phases.DefaultExpected()
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part == "" {
			continue
		}
		name, dur, ok := strings.Cut(part, "=")
		if !ok || name == "" {
			return fmt.Errorf("%q: want phase=duration, such as reclaim=2m", part)
		}
		if !slices.Contains(phaseNames, name) {
			return fmt.Errorf("%q: no phase %q (phases: %s)", part, name, strings.Join(phaseNames, ", "))
		}
		d, err := time.ParseDuration(dur)
		if err != nil || d < 0 {
			return fmt.Errorf("%q: %q is not a duration", part, dur)
		}
		m[name] = d
	}
	*v.m = m
	return nil
}
