package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/phasegate/phasegate/app"
	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/phasetest"
	"github.com/phasegate/phasegate/phasetest/proc"
)

// bins are the binaries the tests run, built once and removed at the end.
var bins proc.Builds

func TestMain(m *testing.M) { os.Exit(bins.Main(m)) }

// wait bounds every wait for a condition: they hold within milliseconds;
// the bound only keeps a broken test from hanging.
const wait = time.Minute

// prompt is how soon a process that never served must exit: well under
// the default drain delay (5 s), which it must not spend, and generous
// enough for a loaded machine and the race detector.
const prompt = 2 * time.Second

// The process, black-box, in either log format: its phases ran in order,
// upstream beside db; its health over the port said NOT_SERVING and 503
// until the lifecycle served, SERVING and 200 after; its gRPC service and
// HTTP route answer; SIGTERM stops it with exit 0. The upstream answers 503
// until the test has seen the port answer, so there is a before to judge.
func TestProcess(t *testing.T) {
	for _, format := range []string{"text", "json"} {
		t.Run(format, func(t *testing.T) {
			var up atomic.Bool
			upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				if !up.Load() {
					w.WriteHeader(http.StatusServiceUnavailable)
				}
			}))
			t.Cleanup(upstream.Close)
			p := proc.Start(t, bins.Build(t, "."), proc.Env("GORACE=atexit_sleep_ms=0"), proc.Args("-listen", "127.0.0.1:0", "-log-format", format, "-drain-delay", "0s",
				"-db", filepath.Join(t.TempDir(), "adopter.db"), "-upstream", upstream.URL))
			s := p.Follow()
			h := proc.WatchHealth(t, p.Addr(), proc.HTTPPaths("/readyz", "/health"))
			phasetest.WaitPhase(t, s, "upstream", lifecycle.PhaseRetrying, wait)
			h.WaitAnswer(t, proc.Answer.NotServing, wait)
			up.Store(true)
			phasetest.WaitState(t, s, lifecycle.StateServing, wait)
			h.WaitServing(t, wait)

			events := s.Events(0)
			phasetest.AssertOrder(t, events, "config", "db", "cache", "grpc", "serve")
			phasetest.AssertOrder(t, events, "config", "upstream", "grpc")
			phasetest.AssertOverlap(t, events, "upstream", "db")
			phasetest.AssertRespectsDependencies(t, events)
			h.AssertGated(t, events)

			resp, err := http.Get("http://" + p.Addr() + "/v1/items/item-00042")
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || string(body) != "value 42\n" {
				t.Errorf("GET /v1/items/item-00042: %s %q", resp.Status, body)
			}
			conn, err := grpc.NewClient(p.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			got := new(wrapperspb.StringValue)
			if err := conn.Invoke(context.Background(), methodLookup, wrapperspb.String("item-09999"), got); err != nil || got.GetValue() != "value 9999" {
				t.Errorf("Lookup(item-09999) = %q, %v", got.GetValue(), err)
			}

			p.Signal(syscall.SIGTERM)
			if code := p.Wait(wait); code != 0 {
				t.Fatalf("exit code %d after SIGTERM, want 0", code)
			}
			if want := map[string]string{"text": "msg=stopped", "json": `"msg":"stopped"`}[format]; !strings.Contains(p.Output(), want) {
				t.Errorf("the %s log lacks %s", format, want)
			}
		})
	}
}

// A bad flag value fails config, and the process exits 2, a configuration
// error, well within the default drain delay, which a port that never
// served does not spend. So does a -listen the config phase passes on
// through PortFrom that cannot be bound (before, exit 1): a port out of
// range, a name that does not resolve, an address the host does not have.
func TestBadFlagFailsFast(t *testing.T) {
	if d := app.DefaultConfig("", "").DrainDelay; d < 2*prompt {
		t.Fatalf("the default drain delay %v is too short to show it is skipped", d)
	}
	bin := bins.Build(t, ".")
	for _, tc := range []struct {
		name string
		args []string
		want string // in the output
	}{
		{"cache entries", []string{"-listen", "127.0.0.1:0", "-cache-entries", "lots"}, `-cache-entries \"lots\": want a positive number`},
		{"port out of range", []string{"-listen", "127.0.0.1:99999"}, "invalid port"},
		{"a name that does not resolve", []string{"-listen", "adopter.invalid:0"}, "adopter.invalid"},
		{"an address the host does not have", []string{"-listen", "192.0.2.1:0"}, "cannot assign requested address"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The race detector sleeps a second at exit by default.
			p := proc.Start(t, bin, proc.Env("GORACE=atexit_sleep_ms=0"),
				proc.Args(append(tc.args, "-db", filepath.Join(t.TempDir(), "adopter.db"))...))
			if code := p.Wait(wait); code != app.ExitConfig {
				t.Fatalf("exit code %d, want %d (a configuration error):\n%s", code, app.ExitConfig, p.Output())
			}
			took := p.Took()
			if took >= prompt {
				t.Errorf("the process exited %v after it started, want under %v (the drain delay is 5 s)", took, prompt)
			}
			t.Logf("exited 2 %v after exec", took)
			if !strings.Contains(p.Output(), tc.want) {
				t.Errorf("the output does not say %q:\n%s", tc.want, p.Output())
			}
		})
	}
}

// A SIGTERM while the start waits for the upstream drains what had started
// and exits 0, within the same bound: no drain delay on a port that never
// served.
func TestSIGTERMDuringTheStart(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	t.Cleanup(upstream.Close)
	p := proc.Start(t, bins.Build(t, "."), proc.Env("GORACE=atexit_sleep_ms=0"),
		proc.Args("-listen", "127.0.0.1:0", "-db", filepath.Join(t.TempDir(), "adopter.db"), "-upstream", upstream.URL))
	s := p.Follow()
	phasetest.WaitPhase(t, s, "upstream", lifecycle.PhaseRetrying, wait)
	signalled := time.Now()
	p.Signal(syscall.SIGTERM)
	if code := p.Wait(wait); code != 0 {
		t.Fatalf("exit code %d after SIGTERM during the start, want 0", code)
	}
	took := p.Exited().Sub(signalled)
	if took >= prompt {
		t.Errorf("the process exited %v after SIGTERM, want under %v (the drain delay is 5 s)", took, prompt)
	}
	t.Logf("exited 0 %v after SIGTERM", took)
	phasetest.WaitState(t, s, lifecycle.StateDraining, wait)
}

// In process, the same health assertion: the App's port, asked by real
// clients, is gated on serving.
func TestHealthInProcess(t *testing.T) {
	var up atomic.Bool
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if !up.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	t.Cleanup(upstream.Close)
	a, err := newService(app.DefaultConfig("adopter", ""), flags{listen: "127.0.0.1:0", drainDelay: "0s",
		db: filepath.Join(t.TempDir(), "adopter.db"), upstream: upstream.URL, entries: "10000"})
	if err != nil {
		t.Fatal(err)
	}
	started := phasetest.Wrap(t, a).StartInBackground() // the test's end stops the App
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	addr := a.Addr(ctx)
	if addr == nil {
		t.Fatal("the port was never bound")
	}
	h := proc.WatchHealth(t, addr.String())
	h.WaitAnswer(t, proc.Answer.NotServing, wait)
	up.Store(true)
	if err := <-started; err != nil {
		t.Fatal(err)
	}
	h.WaitServing(t, wait)
	h.AssertGated(t, a.Lifecycle().Events(0))
	phasetest.AssertOverlap(t, a.Lifecycle().Events(0), "upstream", "db")
}
