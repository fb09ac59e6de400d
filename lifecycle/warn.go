package lifecycle

import (
	"slices"
	"time"
)

// Warning is a condition that leaves the lifecycle able to serve but worth an
// operator's attention: a prerequisite missing on the host, work lost across
// a restart, a clean-up still running in the background. Health endpoints
// report a serving lifecycle with warnings as "warn", not "pass".
type Warning struct {
	// Name identifies the condition ("egress", "leases-lost").
	Name string
	// Message says what is wrong, in one line.
	Message string
	// Since is when the warning was first set with its current message.
	Since time.Time
}

// Warn sets the named warning, or replaces its message, and records an
// [EventWarningSet]. Setting the same message again changes nothing. An
// empty name is ignored, and so is every warning once the lifecycle has
// stopped or was drained before it started: nothing is left to warn about.
func (l *Lifecycle) Warn(name, message string) {
	if name == "" {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.eventsDone {
		return
	}
	i := slices.IndexFunc(l.warnings, func(w Warning) bool { return w.Name == name })
	if i >= 0 && l.warnings[i].Message == message {
		return
	}
	w := Warning{Name: name, Message: message, Since: time.Now()}
	// A new slice each time: snapshots already handed out share the old one.
	ws := slices.Clone(l.warnings)
	if i >= 0 {
		ws[i] = w
	} else {
		ws = append(ws, w)
	}
	l.warnings = ws
	l.recordLocked(Event{Time: w.Since, Kind: EventWarningSet, Name: name, Message: message})
	l.publishLocked()
}

// ClearWarning removes the named warning, if set, and records an
// [EventWarningCleared]. Like Warn, it is ignored once the lifecycle has
// stopped.
func (l *Lifecycle) ClearWarning(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	i := slices.IndexFunc(l.warnings, func(w Warning) bool { return w.Name == name })
	if i < 0 || l.eventsDone {
		return
	}
	cleared := l.warnings[i]
	l.warnings = slices.Delete(slices.Clone(l.warnings), i, i+1)
	l.recordLocked(Event{Time: time.Now(), Kind: EventWarningCleared, Name: name, Message: cleared.Message})
	l.publishLocked()
}
