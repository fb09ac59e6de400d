package compare

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/phasegate/phasegate/phasetest/proc"
)

// The minimal services that compare/weigh measures are the same service:
// each serves grpc.health.v1 SERVING and /health 200 on its port, exits 0
// on SIGTERM, and exits non-zero when its config step fails: 2 on
// phasegate, whose config phase says it is a configuration error
// (app.BadConfig), 1 on the others, which have no such contract.
// phasegate's keeps DefaultConfig's 5 s drain delay and still exits in
// under a second (a fifth of it): a port that never served skips the
// delay. A SIGTERM during the start (a config step of 5 s) ends
// phasegate's with exit 0 at once, for the same reason, and kills the
// others: their signal handling begins after the config step.
func TestMinimalServices(t *testing.T) {
	const failBound = time.Second
	for _, w := range []struct {
		name, pkg         string
		failExit          int
		killedDuringStart bool
	}{
		{"phasegate", "./minimal/pgmin", 2, false},
		{"fx", "./minimal/fxmin", 1, true},
		{"run", "./minimal/runmin", 1, true},
	} {
		t.Run(w.name, func(t *testing.T) {
			bin := bins.Build(t, w.pkg)

			began := time.Now()
			failed := proc.Start(t, bin, proc.Args("-fail"))
			if code := failed.Wait(wait); code != w.failExit {
				t.Errorf("-fail: exit %d, want %d\n%s", code, w.failExit, failed.Output())
			}
			if took := time.Since(began); took > failBound {
				t.Errorf("-fail: exited %v after exec, want under %v", took, failBound)
			}

			startingAddr := freePort(t)
			starting := proc.Start(t, bin, proc.Args("-listen", startingAddr, "-slow", "5s"))
			if w.killedDuringStart {
				// fx and run show nothing during their config step (no
				// port, no output): well past the runtime's start is the
				// best that can be known of being in it.
				time.Sleep(300 * time.Millisecond)
			} else {
				eventually(t, "/health naming the config phase", func() bool {
					code, body, err := tryGet(startingAddr, "/health")
					return err == nil && code == 503 && strings.Contains(body, "phase config")
				})
			}
			signalled := time.Now()
			starting.Signal(syscall.SIGTERM)
			st := starting.WaitState(wait)
			if took := time.Since(signalled); !w.killedDuringStart && took > 3*time.Second {
				t.Errorf("SIGTERM during the start: ended %v after it, want before the config step's 5 s or the drain delay's", took)
			}
			ws, _ := st.Sys().(syscall.WaitStatus)
			if killed := ws.Signaled(); killed != w.killedDuringStart || (!killed && st.ExitCode() != 0) {
				t.Errorf("SIGTERM during the start: %v, want killed %v or else exit 0\n%s", st, w.killedDuringStart, starting.Output())
			}

			addr := freePort(t)
			p := proc.Start(t, bin, proc.Args("-listen", addr))
			eventually(t, "SERVING over grpc.health.v1", func() bool { return grpcServing(addr) })
			if code, body, err := tryGet(addr, "/health"); err != nil || code != 200 {
				t.Errorf("GET /health: %d %q %v", code, body, err)
			}
			p.Signal(syscall.SIGTERM)
			if code := p.Wait(wait); code != 0 {
				t.Errorf("SIGTERM: exit %d, want 0\n%s", code, p.Output())
			}
		})
	}
}

// grpcServing reports whether addr answers grpc.health.v1 with SERVING.
func grpcServing(addr string) bool {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return false
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	return err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING
}

// The minimal service on phasegate links the App and nothing it does not
// use: with no exporter given, neither the OpenTelemetry SDKs nor
// otelgrpc, nor an HTTP client. Issue 36's goal, which compare/weigh
// measures for docs/FRAMEWORK.md: at most fx's modules + 4, and a
// stripped binary at most 1.1 times fx's (sizes are the same from one
// build to the next with one toolchain).
func TestMinimalServiceWeight(t *testing.T) {
	dir := t.TempDir()
	pg := weighBinary(t, "./minimal/pgmin", filepath.Join(dir, "pgmin"))
	fx := weighBinary(t, "./minimal/fxmin", filepath.Join(dir, "fxmin"))
	for _, m := range pg.modules {
		for _, unwanted := range []string{"go.opentelemetry.io/otel/sdk", "otelgrpc", "github.com/go-logr/", "github.com/google/uuid", "go.opentelemetry.io/auto/sdk", "go.opentelemetry.io/otel/log"} {
			if strings.Contains(m, unwanted) {
				t.Errorf("the minimal service links %s, which only an exporter needs", m)
			}
		}
	}
	if len(pg.modules) > len(fx.modules)+4 {
		t.Errorf("%d modules linked, want at most fx's %d + 4: %q", len(pg.modules), len(fx.modules), pg.modules)
	}
	if ratio := float64(pg.stripped) / float64(fx.stripped); ratio > 1.1 {
		t.Errorf("stripped %d bytes, %.3f times fx's %d: want at most 1.1", pg.stripped, ratio, fx.stripped)
	}
	if bytes.Contains(pg.symbols, []byte("net/http.(*Transport).roundTrip")) {
		t.Error("the minimal service links net/http's client Transport")
	}
}

// binaryWeight is what TestMinimalServiceWeight reads of a build.
type binaryWeight struct {
	modules  []string // go version -m's deps
	stripped int64    // built with -ldflags=-s -w
	symbols  []byte   // go tool nm of the unstripped build
}

// weighBinary builds pkg plain and stripped at out and reads their weight.
func weighBinary(t *testing.T, pkg, out string) binaryWeight {
	t.Helper()
	goCmd := func(args ...string) []byte {
		t.Helper()
		b, err := exec.Command("go", args...).CombinedOutput()
		if err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, b)
		}
		return b
	}
	goCmd("build", "-o", out, pkg)
	goCmd("build", "-ldflags=-s -w", "-o", out+".stripped", pkg)
	var w binaryWeight
	for line := range strings.Lines(string(goCmd("version", "-m", out))) {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "dep" {
			w.modules = append(w.modules, f[1])
		}
	}
	w.symbols = goCmd("tool", "nm", out)
	fi, err := os.Stat(out + ".stripped")
	if err != nil {
		t.Fatal(err)
	}
	w.stripped = fi.Size()
	return w
}
