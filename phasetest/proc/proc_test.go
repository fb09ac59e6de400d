package proc_test

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/phasetest"
	"github.com/phasegate/phasegate/phasetest/proc"
)

var bins proc.Builds

func TestMain(m *testing.M) { os.Exit(bins.Main(m)) }

const wait = time.Minute

const svc = "github.com/phasegate/phasegate/phasetest/proc/internal/gatedsvc"

// held starts gatedsvc with its start held until the returned release.
func held(t *testing.T, args ...string) (*proc.Process, func()) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close(); _ = w.Close() })
	p := proc.Start(t, bins.Build(t, svc), proc.Args(append([]string{"-hold"}, args...)...),
		proc.Prepare(func(c *exec.Cmd) { c.Stdin = r }))
	return p, func() {
		if _, err := io.WriteString(w, "go\n"); err != nil {
			t.Fatal(err)
		}
	}
}

// A process started, found by its address file in either log format,
// followed, watched, stopped: its order, its health gated on serving, its
// exit code.
func TestProcess(t *testing.T) {
	for _, format := range []string{"text", "json"} {
		t.Run(format, func(t *testing.T) {
			p, release := held(t, "-log-format", format)
			s := p.Follow()
			h := proc.WatchHealth(t, p.Addr(), proc.HTTPPaths("/readyz", "/health"))
			h.WaitAnswer(t, proc.Answer.NotServing, wait)
			release()
			phasetest.WaitState(t, s, lifecycle.StateServing, wait)
			h.WaitServing(t, wait)
			phasetest.AssertOrder(t, s.Events(0), "config", "hold", "serve")
			h.AssertGated(t, s.Events(0))
			p.Signal(syscall.SIGTERM)
			if code := p.Wait(wait); code != 0 {
				t.Fatalf("exit code %d after SIGTERM, want 0", code)
			}
			if want := map[string]string{"text": "msg=stopped", "json": `"msg":"stopped"`}[format]; !strings.Contains(p.Output(), want) {
				t.Errorf("the output lacks %s:\n%s", want, p.Output())
			}
		})
	}
}

// A start that fails exits 1, and Wait says so; Addr would have failed.
func TestExitCode(t *testing.T) {
	p := proc.Start(t, bins.Build(t, svc), proc.Args("-fail"))
	if code := p.Wait(wait); code != 1 {
		t.Fatalf("exit code %d, want 1", code)
	}
	if !strings.Contains(p.Output(), "config: -fail") {
		t.Errorf("the output does not name the failure:\n%s", p.Output())
	}
	if p.Took() <= 0 || p.Exited().Before(p.Began()) {
		t.Errorf("took %v, began %v, exited %v", p.Took(), p.Began(), p.Exited())
	}
}

// A process the test leaves running is killed and reaped at its end.
func TestCleanupKills(t *testing.T) {
	var p *proc.Process
	t.Run("leaves it running", func(t *testing.T) {
		p, _ = held(t)
		p.Addr()
	})
	select {
	case <-p.Done():
	default:
		t.Fatal("the subtest ended and its process still runs")
	}
	if st := p.WaitState(wait); st.Exited() || st.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("the process ended %v, want killed", st)
	}
}

// spyTB records what an assertion reports instead of failing the test.
type spyTB struct {
	testing.TB
	errors []string
}

func (s *spyTB) Errorf(format string, args ...any) {
	s.errors = append(s.errors, fmt.Sprintf(format, args...))
}

// AssertGated fails on answers that said serving before the lifecycle
// did, and on a watch that saw nothing before serving: the process's log
// is shifted, or the watch started late.
func TestAssertGatedCatches(t *testing.T) {
	tests := []struct {
		name  string
		late  bool                                        // watch once serving
		shift func(e []lifecycle.Event) []lifecycle.Event // what the log says
		want  string
	}{
		{
			name: "serving answered before the lifecycle served",
			shift: func(events []lifecycle.Event) []lifecycle.Event {
				for i, e := range events {
					if e.Kind == lifecycle.EventLifecycle && e.To == lifecycle.StateServing {
						events[i].Time = time.Now().Add(time.Hour)
					}
				}
				return events
			},
			want: "grpc answered SERVING before serving",
		},
		{name: "watched too late", late: true, want: "never answered before serving"},
		{
			name:  "never served",
			shift: func([]lifecycle.Event) []lifecycle.Event { return nil },
			want:  "never turned serving",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, release := held(t)
			s := p.Follow()
			var h *proc.HealthWatch
			if !tt.late {
				h = proc.WatchHealth(t, p.Addr())
				h.WaitAnswer(t, proc.Answer.NotServing, wait)
			}
			release()
			phasetest.WaitState(t, s, lifecycle.StateServing, wait)
			if tt.late {
				h = proc.WatchHealth(t, p.Addr())
			}
			h.WaitServing(t, wait)
			events := s.Events(0)
			if tt.shift != nil {
				events = tt.shift(events)
			}
			spy := &spyTB{TB: t}
			if h.AssertGated(spy, events) || len(spy.errors) != 1 || !strings.Contains(spy.errors[0], tt.want) {
				t.Fatalf("AssertGated reported %q, want %q", spy.errors, tt.want)
			}
		})
	}
}

// An ended process's state is there with a zero timeout: WaitState does
// not race the end against its timer.
func TestWaitStateOfAnEndedProcess(t *testing.T) {
	p := proc.Start(t, bins.Build(t, svc), proc.Args("-fail"))
	<-p.Done()
	for range 100 {
		if code := p.Wait(0); code != 1 {
			t.Fatalf("exit code %d, want 1", code)
		}
	}
}
