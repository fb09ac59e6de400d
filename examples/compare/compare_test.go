package compare

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/phasegate/phasegate/examples/catalog/catalogdb"
	"github.com/phasegate/phasegate/examples/catalog/catalogv1"
	"github.com/phasegate/phasegate/phasetest/proc"
)

// bins are the binaries the tests run, built once and removed at the end.
var bins proc.Builds

func TestMain(m *testing.M) { os.Exit(bins.Main(m)) }

const wait = time.Minute

// wirings are the three programs: the same work, wired three ways.
var wirings = []struct{ name, pkg string }{
	{"phasegate", "github.com/phasegate/phasegate/examples/catalog"},
	{"fx", "github.com/phasegate/phasegate/examples/compare/fxcatalog"},
	{"run", "github.com/phasegate/phasegate/examples/compare/runcatalog"},
}

// Each wiring serves the same API once started, and stops with exit 0 on
// SIGTERM: the line counts of FRAMEWORK.md compare working programs. The
// times from exec to the port accepting and to the first product served
// are logged (one run; not asserted).
func TestSameService(t *testing.T) {
	// Enough products for the migration to take seconds; under the race
	// detector a tenth, for the suite's sake (the times logged are then
	// not the ones FRAMEWORK.md quotes).
	products := int64(20000)
	if proc.Race {
		products = 2000
	}
	for _, w := range wirings {
		t.Run(w.name, func(t *testing.T) {
			cfgFile, _ := writeConfig(t, int(products))
			addr := freePort(t)
			bin := bins.Build(t, w.pkg)
			began := time.Now()
			p := proc.Start(t, bin, proc.Args("-listen", addr, "-config", cfgFile))
			var portAt, servedAt time.Duration
			var before []string // what a client got before the product, deduplicated
			eventually(t, "the product served", func() bool {
				code, body, err := tryGet(addr, "/v1/products/"+catalogdb.SKU(42))
				what := fmt.Sprint(code)
				if err != nil {
					what = "connection refused"
					if !errors.Is(err, syscall.ECONNREFUSED) {
						what = err.Error()
					}
				} else if portAt == 0 {
					portAt = time.Since(began)
				}
				if code == http.StatusServiceUnavailable {
					what += " " + strings.TrimSpace(body)
					if i := strings.Index(what, "phase "); i > 0 {
						what = "503 …" + strings.Fields(what[i:])[1] // the phase's name
					}
				}
				if len(before) == 0 || before[len(before)-1] != what {
					before = append(before, what)
				}
				if code == http.StatusOK {
					servedAt = time.Since(began)
					return true
				}
				return false
			})
			t.Logf("%s: port accepting after %v, product served after %v; a client saw %s",
				w.name, portAt.Round(time.Millisecond), servedAt.Round(time.Millisecond), strings.Join(before, " → "))

			conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			if n, err := catalogv1.NewClient(conn).Count(ctx); err != nil || n != products {
				t.Errorf("Count = %d, %v; want %d", n, err, products)
			}
			h, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
			if err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
				t.Errorf("gRPC health: %v, %v; want SERVING", h, err)
			}
			code, body, err := tryGet(addr, "/health")
			if err != nil || code != http.StatusOK {
				t.Errorf("/health: %d %s %v", code, body, err)
			}
			conn.Close()
			p.Signal(syscall.SIGTERM)
			if code := p.Wait(wait); code != 0 {
				t.Errorf("exit code %d after SIGTERM, want 0", code)
			}
		})
	}
}

// While the start waits (here for the store's lock, held by the test), a
// client of phasegate's catalog gets 503 and the reason, on every dialect;
// a client of the fx and run wirings gets "connection refused", since their
// port binds once everything before it is done.
func TestClientDuringTheStart(t *testing.T) {
	want := map[string][]string{
		"phasegate": {"503 ", `"output":"starting: phase migrate waiting for the lock`},
		"fx":        {"connection refused"},
		"run":       {"connection refused"},
	}
	for _, w := range wirings {
		t.Run(w.name, func(t *testing.T) {
			cfgFile, dbPath := writeConfig(t, 10)
			unlock := holdLock(t, dbPath)
			addr := freePort(t)
			p := proc.Start(t, bins.Build(t, w.pkg), proc.Args("-listen", addr, "-config", cfgFile))
			waitOpened(t, p, dbPath)
			// Opening the file comes after binding the port in
			// phasegate's catalog, and the message comes after the
			// first wait for the lock.
			var got string
			eventually(t, "the answer while waiting", func() bool {
				code, body, err := tryGet(addr, "/health")
				switch {
				case errors.Is(err, syscall.ECONNREFUSED):
					got = "connection refused"
				case err != nil:
					got = err.Error()
				default:
					got = fmt.Sprintf("%d %s", code, body)
				}
				for _, w := range want[w.name] {
					if !strings.Contains(got, w) {
						return false
					}
				}
				return true
			})
			unlock()
			eventually(t, "serving once the lock is free", func() bool {
				code, _, err := tryGet(addr, "/health")
				return err == nil && code == http.StatusOK
			})
		})
	}
}

// A SIGTERM during the start: phasegate drains what had started (the port,
// the open store) and exits 0. fx and run have not installed their signal
// handlers yet (fx does in Run once its OnStart hooks returned; run in its
// group's actor), so the default action kills the process: no stop hook
// runs, exit by signal.
func TestSignalDuringTheStart(t *testing.T) {
	for _, w := range wirings {
		t.Run(w.name, func(t *testing.T) {
			cfgFile, dbPath := writeConfig(t, 10)
			holdLock(t, dbPath)
			addr := freePort(t)
			p := proc.Start(t, bins.Build(t, w.pkg), proc.Args("-listen", addr, "-config", cfgFile))
			waitOpened(t, p, dbPath)
			p.Signal(syscall.SIGTERM)
			st := p.WaitState(wait)
			switch ws := st.Sys().(syscall.WaitStatus); {
			case w.name == "phasegate" && !(ws.Exited() && ws.ExitStatus() == 0):
				t.Errorf("phasegate: %v, want exit 0 after an orderly drain", st)
			case w.name != "phasegate" && !(ws.Signaled() && ws.Signal() == syscall.SIGTERM):
				t.Errorf("%s: %v, want killed by SIGTERM", w.name, st)
			}
			t.Logf("%s: %v", w.name, st)
		})
	}
}

// holdLock opens the store's file with bbolt, which locks it, until the
// returned function or the test's end.
func holdLock(t *testing.T, path string) (unlock func()) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return func() {
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// waitOpened waits until the process has the file at path open: it is
// then in catalogdb.Open, waiting for the lock.
func waitOpened(t *testing.T, p *proc.Process, path string) {
	t.Helper()
	eventually(t, "the process opening "+path, func() bool {
		fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", p.Pid()))
		for _, fd := range fds {
			if target, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", p.Pid(), fd.Name())); target == path {
				return true
			}
		}
		return false
	})
}

func writeConfig(t *testing.T, products int) (cfgFile, db string) {
	t.Helper()
	dir := t.TempDir()
	db = filepath.Join(dir, "catalog.db")
	cfgFile = filepath.Join(dir, "catalog.json")
	b, err := json.Marshal(catalogdb.Config{DB: db, Products: products})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfgFile, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return cfgFile, db
}

// freePort returns a loopback address that was free a moment ago: fx and
// run do not log the address they bound, so the test picks it.
func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func tryGet(addr, path string) (int, string, error) {
	c := &http.Client{Timeout: 5 * time.Second}
	defer c.CloseIdleConnections()
	resp, err := c.Get("http://" + addr + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %s", what, wait)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
