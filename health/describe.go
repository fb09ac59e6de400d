package health

import (
	"strconv"
	"strings"
	"time"

	"github.com/phasegate/phasegate/lifecycle"
)

// view is what every dialect renders: a lifecycle snapshot and whether the
// checker was shut down ahead of the lifecycle.
type view struct {
	snap     lifecycle.Snapshot
	shutdown bool
}

// state is the lifecycle state as checks should see it: a checker shut down
// ahead of its lifecycle (a server draining) reads as draining whatever the
// lifecycle still does, unless it already failed or stopped.
func (v view) state() lifecycle.State {
	switch s := v.snap.State; {
	case !v.shutdown:
		return s
	case s == lifecycle.StateCreated, s == lifecycle.StateStarting, s == lifecycle.StateServing:
		return lifecycle.StateDraining
	default:
		return s
	}
}

// ready reports whether the daemon takes work.
func (v view) ready() bool { return v.state() == lifecycle.StateServing }

// live reports whether the daemon is alive: anything but failed.
func (v view) live() bool { return v.state() != lifecycle.StateFailed }

// startedUp reports whether startup completed: serving, or draining and
// stopped after having served without a failure. A lifecycle drained during
// its start never completed it, so its /startupz stays 503: a startup probe
// that turned 200 then would tell Kubernetes the container started (and
// begin liveness probes) for a process that is on its way out, and would
// flip back to 503 once stopped.
func (v view) startedUp() bool {
	switch v.state() {
	case lifecycle.StateServing:
		return true
	case lifecycle.StateDraining, lifecycle.StateStopped:
		return v.snap.Err == nil && served(v.snap)
	}
	return false
}

func (v view) describe() string { return describe(v.shown(), false) }

func (v view) describeWithETA() string { return describe(v.shown(), true) }

// shown is the snapshot with the state checks should see.
func (v view) shown() lifecycle.Snapshot {
	s := v.snap
	s.State = v.state()
	return s
}

// served reports whether the lifecycle ever reached serving.
func served(s lifecycle.Snapshot) bool {
	for _, t := range s.History {
		if t.State == lifecycle.StateServing {
			return true
		}
	}
	return false
}

// Describe says in one line what a lifecycle is doing and, when it is not
// serving, why not: "starting: phase reclaim 1200/5000 namespaces",
// "serving", "draining", "failed: phase \"storage\" failed after 1 attempt:
// …". Warnings follow while created, starting or serving: "serving; 2
// warnings: egress: net.ipv4.ip_forward is 0; reclaim-dead: 3000 dead slots
// left (1200/3000 namespaces)", the progress being that of the background
// task named like the warning, while it runs. Health endpoints, sd_notify
// STATUS lines and the Unavailable errors of not-yet-served calls all use
// it, so an operator reads the same words everywhere.
func Describe(s lifecycle.Snapshot) string { return describe(s, false) }

// DescribeWithETA is [Describe] with the rate and time left that s carries
// for each running phase, and for each background task named like a
// warning, where known: "starting: phase reclaim 1200/5000 namespaces
// (812/s, ~4.7s left)". sd_notify STATUS lines use it.
func DescribeWithETA(s lifecycle.Snapshot) string { return describe(s, true) }

// describe is [Describe], with the estimates s carries when withETA.
func describe(s lifecycle.Snapshot, withETA bool) string {
	var b strings.Builder
	b.WriteString(string(s.State))
	switch s.State {
	case lifecycle.StateStarting:
		for i, p := range s.Current() {
			if i == 0 {
				b.WriteString(": ")
			} else {
				b.WriteString(", ")
			}
			b.WriteString("phase ")
			b.WriteString(p.Name)
			if d := phaseDetail(p); d != "" {
				b.WriteByte(' ')
				b.WriteString(d)
			}
			if withETA && p.ETA.OK && p.State == lifecycle.PhaseRunning {
				b.WriteString(" (" + p.ETA.String() + ")")
			}
		}
	case lifecycle.StateFailed:
		if s.Err != nil {
			b.WriteString(": ")
			b.WriteString(s.Err.Error())
		}
	case lifecycle.StateServing:
		if s.Degraded {
			b.WriteString(", degraded")
			for _, t := range s.Tasks {
				if t.State == lifecycle.TaskFailed && t.Err != nil {
					b.WriteString(": task ")
					b.WriteString(t.Name)
					b.WriteString(": ")
					b.WriteString(t.Err.Error())
					break
				}
			}
		}
	}
	switch s.State {
	case lifecycle.StateCreated, lifecycle.StateStarting, lifecycle.StateServing:
		if n := len(s.Warnings); n > 0 {
			b.WriteString("; ")
			b.WriteString(strconv.Itoa(n))
			if n == 1 {
				b.WriteString(" warning: ")
			} else {
				b.WriteString(" warnings: ")
			}
			for i, w := range s.Warnings {
				if i > 0 {
					b.WriteString("; ")
				}
				b.WriteString(w.Name)
				b.WriteString(": ")
				b.WriteString(warningDetail(w, s, withETA))
			}
		}
	}
	return oneLine(b.String())
}

// warningTask returns the running background task named like w, if any:
// the work that will clear the condition, such as reclaiming dead slots.
func warningTask(w lifecycle.Warning, s lifecycle.Snapshot) (lifecycle.TaskSnapshot, bool) {
	for i := len(s.Tasks) - 1; i >= 0; i-- {
		if t := s.Tasks[i]; t.Name == w.Name && t.State == lifecycle.TaskRunning {
			return t, true
		}
	}
	return lifecycle.TaskSnapshot{}, false
}

// warningDetail is a warning's message and, while the task named like it
// runs, the task's progress and, when withETA, its rate and time left:
// "3000 dead slots left (1200/3000 namespaces, 812/s, ~1.5s left)".
func warningDetail(w lifecycle.Warning, s lifecycle.Snapshot, withETA bool) string {
	t, ok := warningTask(w, s)
	if !ok {
		return w.Message
	}
	var parts []string
	if p := t.Progress.String(); p != "" {
		parts = append(parts, p)
	}
	if withETA {
		if e := t.ETA.String(); e != "" {
			parts = append(parts, e)
		}
	}
	if len(parts) == 0 {
		return w.Message
	}
	return w.Message + " (" + strings.Join(parts, ", ") + ")"
}

// phaseDetail is what a running or retrying phase is doing:
// "1200/5000 namespaces", or "retrying after attempt 2: <err>".
func phaseDetail(p lifecycle.PhaseSnapshot) string {
	if p.State == lifecycle.PhaseRetrying {
		d := "retrying after attempt " + strconv.Itoa(p.Attempts)
		if p.Err != nil {
			d += ": " + p.Err.Error()
		}
		return d
	}
	return p.Progress.String()
}

// checkDetail is a phase's line in a kube-style check list, after its
// name: "running: 1200/5000 namespaces", "pending", "failed: <err>".
func checkDetail(p lifecycle.PhaseSnapshot) string {
	d := string(p.State)
	switch {
	case p.State == lifecycle.PhaseRetrying:
		d = phaseDetail(p)
	case p.Err != nil && p.State.Done():
		d += ": " + p.Err.Error()
	case !p.Progress.IsZero():
		d += ": " + p.Progress.String()
	}
	return oneLine(d)
}

// oneLine keeps a text on one line, for STATUS= and check lists.
func oneLine(s string) string {
	if !strings.ContainsAny(s, "\r\n") {
		return s
	}
	return strings.Join(strings.Fields(strings.NewReplacer("\r", " ", "\n", " ").Replace(s)), " ")
}

// round keeps durations readable in bodies.
func round(d time.Duration) time.Duration {
	switch {
	case d >= time.Second:
		return d.Round(time.Millisecond)
	case d >= time.Millisecond:
		return d.Round(time.Microsecond)
	}
	return d
}
