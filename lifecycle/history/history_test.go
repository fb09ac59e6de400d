package history_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/lifecycle/history"
)

// start is a served start whose reclaim took took with total namespaces.
func start(began time.Time, took time.Duration, total int64) history.Start {
	return history.Start{Began: began, Outcome: "serving", Took: took, Steps: []history.Step{
		{Name: "reclaim", Took: took, Attempts: 1, Total: total, Unit: "namespaces", Outcome: "succeeded"},
	}}
}

// The ring keeps the newest starts across a reopen, oldest first, and
// Usual speaks only from three starts on.
func TestRingAcrossReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "starts.json")
	l, err := history.Open(path, 4)
	if err != nil {
		t.Fatalf("Open of a missing file: %v", err)
	}
	t0 := time.Unix(1_700_000_000, 0)
	for i := range 6 {
		if i == 2 {
			if _, ok := l.Usual("reclaim", false); ok {
				t.Error("Usual from 2 starts")
			}
			if l, _ = history.Open(path, 4); len(l.Starts()) != 2 {
				t.Fatalf("reopened after 2 starts: %d", len(l.Starts()))
			}
			if _, ok := l.Usual("reclaim", false); ok {
				t.Error("Usual from 2 starts")
			}
		}
		if err := l.Add(start(t0.Add(time.Duration(i)*time.Minute), time.Duration(100+i)*time.Millisecond, 10)); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok := l.Usual("reclaim", false); ok {
		t.Error("Usual counts the starts added since Open: the current one would be compared with itself")
	}
	again, err := history.Open(path, 4)
	if err != nil {
		t.Fatal(err)
	}
	got := again.Starts()
	if len(got) != 4 || !got[0].Began.Equal(t0.Add(2*time.Minute)) || !got[3].Began.Equal(t0.Add(5*time.Minute)) {
		t.Fatalf("reopened ring: %d starts, from %v to %v; want the 4 newest", len(got), got[0].Began, got[len(got)-1].Began)
	}
	u, ok := again.Usual("reclaim", false)
	if !ok || u.Starts != 4 || u.Median != 104*time.Millisecond || u.Low != 102*time.Millisecond || u.High != 105*time.Millisecond || u.Total != 10 {
		t.Errorf("Usual: %+v %v", u, ok)
	}
	if s := u.String(); s != "usually 104ms (102ms–105ms) over the last 4 starts, ~10 namespaces" {
		t.Errorf("String: %q", s)
	}
	if _, ok := again.Usual("reclaim", true); ok {
		t.Error("a task of a phase's name has a usual")
	}
}

// Slow means at least 3 times the median and half a second more.
func TestSlow(t *testing.T) {
	u := history.Usual{Starts: 5, Median: 300 * time.Millisecond}
	quick := history.Usual{Starts: 5, Median: 2 * time.Millisecond}
	for _, tc := range []struct {
		u    history.Usual
		took time.Duration
		want bool
	}{
		{u, 4600 * time.Millisecond, true},
		{u, 800 * time.Millisecond, false},
		{u, 900 * time.Millisecond, true},
		{quick, 40 * time.Millisecond, false},
		{quick, time.Second, true},
		{history.Usual{}, time.Hour, false},
	} {
		if got := tc.u.Slow(tc.took); got != tc.want {
			t.Errorf("median %v, took %v: Slow %v, want %v", tc.u.Median, tc.took, got, tc.want)
		}
	}
}

// A damaged, foreign or linked file is an empty history, with an error
// saying why, and the next Add replaces it; a link is never written
// through.
func TestOpenDamaged(t *testing.T) {
	dir := t.TempDir()
	victim := filepath.Join(dir, "victim")
	if err := os.WriteFile(victim, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, want string
		make       func(path string) error
	}{
		{"truncated", "damaged", func(p string) error { return os.WriteFile(p, []byte(`{"version":1,"starts":[{"began`), 0o600) }},
		{"another version", "version 7", func(p string) error { return os.WriteFile(p, []byte(`{"version":7,"starts":[]}`), 0o600) }},
		{"a directory", "not a regular file", func(p string) error { return os.Mkdir(p, 0o700) }},
		{"a link", "open", func(p string) error { return os.Symlink(victim, p) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-"))
			if err := tc.make(path); err != nil {
				t.Fatal(err)
			}
			l, err := history.Open(path, 0)
			if err == nil || !strings.Contains(err.Error(), tc.want) || l == nil || len(l.Starts()) != 0 {
				t.Fatalf("Open: %v, %v; want an empty Log and an error saying %q", l, err, tc.want)
			}
			if tc.name == "a directory" {
				return
			}
			if err := l.Add(start(time.Now(), time.Second, 1)); err != nil {
				t.Fatal(err)
			}
			if again, err := history.Open(path, 0); err != nil || len(again.Starts()) != 1 {
				t.Errorf("after Add: %v, %d starts", err, len(again.Starts()))
			}
		})
	}
	if b, _ := os.ReadFile(victim); string(b) != "keep" {
		t.Errorf("the link's target was written: %q", b)
	}
}

// StartOf reads a start from a lifecycle's snapshot: its outcome, how long
// it took to serve, and each phase with its attempts and progress.
func TestStartOf(t *testing.T) {
	n := 0
	lc, err := lifecycle.New([]lifecycle.Phase{
		{Name: "reclaim", Retry: lifecycle.RetryPolicy{Attempts: 2}, Run: func(_ context.Context, p *lifecycle.Progress) error {
			if n++; n == 1 {
				return os.ErrDeadlineExceeded
			}
			p.SetTotal(12, "namespaces")
			p.SetDone(12)
			return nil
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := lc.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer lc.Drain(context.Background())
	s := history.StartOf(lc.Snapshot(), time.Now())
	if s.Outcome != "serving" || s.Took <= 0 || len(s.Steps) != 1 {
		t.Fatalf("StartOf: %+v", s)
	}
	if st := s.Steps[0]; st.Name != "reclaim" || st.Attempts != 2 || st.Total != 12 || st.Unit != "namespaces" || st.Outcome != "succeeded" {
		t.Errorf("step: %+v", st)
	}
}
