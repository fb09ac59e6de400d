package health_test

import (
	"errors"
	"testing"

	"github.com/phasegate/phasegate/health"
	"github.com/phasegate/phasegate/lifecycle"
)

func TestDescribe(t *testing.T) {
	reclaim := lifecycle.PhaseSnapshot{Name: "reclaim", State: lifecycle.PhaseRunning,
		Progress: lifecycle.ProgressSnapshot{Done: 1200, Total: 5000, Unit: "namespaces"}}
	listen := lifecycle.PhaseSnapshot{Name: "listen", State: lifecycle.PhaseRunning}
	retrying := lifecycle.PhaseSnapshot{Name: "storage", State: lifecycle.PhaseRetrying, Attempts: 2, Err: errors.New("disk\nbusy")}
	done := lifecycle.PhaseSnapshot{Name: "lock", State: lifecycle.PhaseSucceeded}
	tests := []struct {
		name string
		s    lifecycle.Snapshot
		want string
	}{
		{"created", lifecycle.Snapshot{State: lifecycle.StateCreated}, "created"},
		{"starting between phases", lifecycle.Snapshot{State: lifecycle.StateStarting, Phases: []lifecycle.PhaseSnapshot{done}}, "starting"},
		{"one phase", lifecycle.Snapshot{State: lifecycle.StateStarting, Phases: []lifecycle.PhaseSnapshot{done, reclaim}},
			"starting: phase reclaim 1200/5000 namespaces"},
		{"two phases", lifecycle.Snapshot{State: lifecycle.StateStarting, Phases: []lifecycle.PhaseSnapshot{done, listen, reclaim}},
			"starting: phase listen, phase reclaim 1200/5000 namespaces"},
		{"retrying, one line", lifecycle.Snapshot{State: lifecycle.StateStarting, Phases: []lifecycle.PhaseSnapshot{retrying}},
			"starting: phase storage retrying after attempt 2: disk busy"},
		{"serving", lifecycle.Snapshot{State: lifecycle.StateServing}, "serving"},
		{"degraded", lifecycle.Snapshot{State: lifecycle.StateServing, Degraded: true,
			Tasks: []lifecycle.TaskSnapshot{{Name: "fill", State: lifecycle.TaskFailed, Err: errors.New("pool full")}}},
			"serving, degraded: task fill: pool full"},
		{"draining", lifecycle.Snapshot{State: lifecycle.StateDraining}, "draining"},
		{"failed", lifecycle.Snapshot{State: lifecycle.StateFailed, Err: errors.New("phase \"reclaim\" failed")}, `failed: phase "reclaim" failed`},
		{"stopped", lifecycle.Snapshot{State: lifecycle.StateStopped}, "stopped"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := health.Describe(tt.s); got != tt.want {
				t.Errorf("Describe() = %q, want %q", got, tt.want)
			}
		})
	}
}
