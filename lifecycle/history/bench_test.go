package history_test

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/phasegate/phasegate/lifecycle/history"
)

// fullRing is a history of 20 starts of the daemon's size: 7 phases and 8
// background tasks each.
func fullRing(b *testing.B) string {
	b.Helper()
	path := filepath.Join(b.TempDir(), "starts.json")
	l, err := history.Open(path, 0)
	if err != nil {
		b.Fatal(err)
	}
	for i := range history.DefaultSize {
		s := history.Start{Began: time.Unix(int64(1_700_000_000+i), 0), Outcome: "serving", Took: 200 * time.Millisecond}
		for j := range 15 {
			s.Steps = append(s.Steps, history.Step{Name: fmt.Sprintf("step-%d", j), Task: j >= 7, Took: time.Duration(j) * time.Millisecond,
				Attempts: 1, Total: 10, Unit: "namespaces", Outcome: "succeeded"})
		}
		if err := l.Add(s); err != nil {
			b.Fatal(err)
		}
	}
	return path
}

// BenchmarkOpen is what a start pays to read a full history.
func BenchmarkOpen(b *testing.B) {
	path := fullRing(b)
	for b.Loop() {
		if _, err := history.Open(path, 0); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAdd is what recording a start costs once it is over: the ring
// written whole, synced and renamed.
func BenchmarkAdd(b *testing.B) {
	path := fullRing(b)
	l, err := history.Open(path, 0)
	if err != nil {
		b.Fatal(err)
	}
	s := l.Starts()[0]
	for b.Loop() {
		if err := l.Add(s); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkUsual is one view's question for one step.
func BenchmarkUsual(b *testing.B) {
	l, err := history.Open(fullRing(b), 0)
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		l.Usual("step-3", false)
	}
}
