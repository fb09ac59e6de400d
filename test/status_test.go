package test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/creack/pty"

	"github.com/phasegate/phasegate/app"
	"github.com/phasegate/phasegate/lifecycle"
)

// fakeDaemon serves /debug/lifecycle from a script of views: a start whose
// reclaim counts up, then serving. Each request moves one step on.
func fakeDaemon(t *testing.T) *httptest.Server {
	t.Helper()
	t0 := time.Now().Add(-time.Second)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	phase := func(name, state string, started, ended time.Time, deps ...string) app.PhaseView {
		p := app.PhaseView{Name: name, State: state, DependsOn: deps, Started: started, Ended: ended, Attempts: 1}
		if !started.IsZero() && !ended.IsZero() {
			p.Duration = ended.Sub(started)
		}
		return p
	}
	var script []app.View
	for k := 0; k <= 10; k++ {
		reclaim := phase("reclaim", "running", ms(2), time.Time{}, "lock")
		reclaim.Duration = time.Duration(k*100) * time.Millisecond
		reclaim.Progress = lifecycle.ProgressSnapshot{Done: int64(k * 400), Total: 4000, Unit: "namespaces"}
		if k >= 2 {
			reclaim.Rate, reclaim.ETA = 4000, time.Duration(10-k)*100*time.Millisecond
		}
		script = append(script, app.View{State: lifecycle.StateStarting, Since: t0, Started: t0, Phases: []app.PhaseView{
			phase("lock", "succeeded", ms(0), ms(2)),
			phase("listen", "succeeded", ms(2), ms(5), "lock"),
			reclaim,
			phase("storage", "pending", time.Time{}, time.Time{}, "reclaim"),
			phase("serve", "pending", time.Time{}, time.Time{}, "storage", "listen"),
		}})
	}
	served := app.View{State: lifecycle.StateServing, Since: ms(1100), Started: t0, Phases: []app.PhaseView{
		phase("lock", "succeeded", ms(0), ms(2)),
		phase("listen", "succeeded", ms(2), ms(5), "lock"),
		phase("reclaim", "succeeded", ms(2), ms(1050), "lock"),
		phase("storage", "succeeded", ms(1050), ms(1060), "reclaim"),
		phase("serve", "succeeded", ms(1060), ms(1100), "storage", "listen"),
	}, Tasks: []app.PhaseView{phase("fill", "succeeded", ms(1100), ms(1300))}}
	served.Phases[2].Progress = lifecycle.ProgressSnapshot{Done: 4000, Total: 4000, Unit: "namespaces"}
	served.Phases[2].Rate = 3816
	script = append(script, served)

	var mu sync.Mutex
	next := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		v := script[min(next, len(script)-1)]
		next++
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(v)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// statusCommand is the phasegate binary's status --watch against srv.
func statusCommand(t *testing.T, srv *httptest.Server) *exec.Cmd {
	t.Helper()
	return exec.Command(binary, "status", "--watch", "--interval=20ms", "--addr="+strings.TrimPrefix(srv.URL, "http://"))
}

// On a terminal, status --watch draws progress bars with rate and time
// left, redraws in place, and ends, with exit 0, once the daemon serves,
// leaving the finished phases with their durations on the screen.
func TestStatusWatchUnderPTY(t *testing.T) {
	srv := fakeDaemon(t)
	cmd := statusCommand(t, srv)
	f, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 30, Cols: 120})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out bytes.Buffer
	copied := make(chan struct{})
	go func() {
		_, _ = io.Copy(&out, f) // ends with EIO once the command exited
		close(copied)
	}()
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	select {
	case err := <-waited:
		if err != nil {
			t.Fatalf("status --watch: %v\n%q", err, out.String())
		}
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("status --watch did not end; output:\n%q", out.String())
	}
	<-copied
	o := out.String()
	for _, want := range []string{
		"\x1b[?25l",            // cursor hidden while drawing
		"\x1b[6A",              // redrawn in place: six lines up
		"\r\x1b[2K",            // each line cleared
		"▶ reclaim",            // the running phase
		"████████",             // its bar
		"2000/4000 namespaces", // its progress
		"4000/s · ~0.5s left",  // its rate and time left
		"phasegate serving · started in 1.1s",
		"✔ reclaim",
		"1.048s · 4000/4000 namespaces · 3816/s",
		"✔ task fill",
		"\x1b[?25h", // the cursor back
	} {
		if !strings.Contains(o, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if t.Failed() {
		t.Logf("output:\n%s", o)
	}
}

// Without a terminal it prints plain lines, no escape sequences, and
// ends with the daemon serving.
func TestStatusWatchPlain(t *testing.T) {
	srv := fakeDaemon(t)
	cmd := statusCommand(t, srv)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		var ee *exec.ExitError
		errors.As(err, &ee)
		t.Fatalf("status --watch: %v\n%s%s", err, stdout.String(), stderr.String())
	}
	o := stdout.String()
	if strings.Contains(o, "\x1b") {
		t.Errorf("escape sequences without a terminal:\n%q", o)
	}
	lines := strings.Split(strings.TrimSpace(o), "\n")
	if len(lines) < 2 || !strings.HasPrefix(lines[0], "starting lock=succeeded(2ms) listen=succeeded(3ms) reclaim=running(0/4000 namespaces)") ||
		!strings.HasPrefix(lines[len(lines)-1], "serving ") {
		t.Errorf("lines:\n%s", o)
	}
}
