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
	egress := lifecycle.Warning{Name: "egress", Message: "net.ipv4.ip_forward is 0"}
	dead := lifecycle.Warning{Name: "reclaim-dead", Message: "3000 dead slots\nleft"}
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
		{"serving, one warning", lifecycle.Snapshot{State: lifecycle.StateServing, Warnings: []lifecycle.Warning{egress}},
			"serving; 1 warning: egress: net.ipv4.ip_forward is 0"},
		{"degraded, two warnings, one with its task", lifecycle.Snapshot{State: lifecycle.StateServing, Degraded: true,
			Warnings: []lifecycle.Warning{egress, dead},
			Tasks: []lifecycle.TaskSnapshot{
				{Name: "fill", State: lifecycle.TaskFailed, Err: errors.New("pool full")},
				{Name: "reclaim-dead", State: lifecycle.TaskRunning, Progress: lifecycle.ProgressSnapshot{Done: 1200, Total: 3000, Unit: "namespaces"}},
			}},
			"serving, degraded: task fill: pool full; 2 warnings: egress: net.ipv4.ip_forward is 0; reclaim-dead: 3000 dead slots left (1200/3000 namespaces)"},
		{"a finished task is not shown", lifecycle.Snapshot{State: lifecycle.StateServing, Warnings: []lifecycle.Warning{dead},
			Tasks: []lifecycle.TaskSnapshot{{Name: "reclaim-dead", State: lifecycle.TaskSucceeded, Progress: lifecycle.ProgressSnapshot{Done: 3000, Total: 3000}}}},
			"serving; 1 warning: reclaim-dead: 3000 dead slots left"},
		{"starting with a warning", lifecycle.Snapshot{State: lifecycle.StateStarting, Phases: []lifecycle.PhaseSnapshot{reclaim}, Warnings: []lifecycle.Warning{egress}},
			"starting: phase reclaim 1200/5000 namespaces; 1 warning: egress: net.ipv4.ip_forward is 0"},
		{"draining leaves warnings out", lifecycle.Snapshot{State: lifecycle.StateDraining, Warnings: []lifecycle.Warning{egress}}, "draining"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := health.Describe(tt.s); got != tt.want {
				t.Errorf("Describe() = %q, want %q", got, tt.want)
			}
		})
	}
}
