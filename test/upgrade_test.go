package test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// checkLoad opens a new connection for every health check, at a steady
// rate, alternating HTTP /health and gRPC Check, and counts the outcomes.
// A checker that meets a closed port sees "connection refused"; one whose
// connection is dropped sees an error: both are failures. 503 and
// NOT_SERVING are answers.
type checkLoad struct {
	ok, notServing, refused, failed atomic.Int64

	mu     sync.Mutex
	errors []string // the first few failures, for the report
	stop   chan struct{}
	wg     sync.WaitGroup
}

func startCheckLoad(addr string, perSecond int) *checkLoad {
	l := &checkLoad{stop: make(chan struct{})}
	interval := time.Second / time.Duration(perSecond)
	l.wg.Go(func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for n := 0; ; n++ {
			select {
			case <-l.stop:
				return
			case <-t.C:
			}
			grpcCheck := n%2 == 1
			l.wg.Go(func() {
				if grpcCheck {
					l.record(checkGRPC(addr))
				} else {
					l.record(checkHTTP(addr))
				}
			})
		}
	})
	return l
}

var errNotServing = errors.New("not serving")

func (l *checkLoad) record(err error) {
	switch {
	case err == nil:
		l.ok.Add(1)
	case errors.Is(err, errNotServing):
		l.notServing.Add(1)
	case errors.Is(err, syscall.ECONNREFUSED):
		l.refused.Add(1)
	default:
		l.failed.Add(1)
		l.mu.Lock()
		if len(l.errors) < 5 {
			l.errors = append(l.errors, err.Error())
		}
		l.mu.Unlock()
	}
}

func (l *checkLoad) finish() string {
	close(l.stop)
	l.wg.Wait()
	return fmt.Sprintf("%d checks: %d serving, %d not serving, %d refused, %d failed %v",
		l.ok.Load()+l.notServing.Load()+l.refused.Load()+l.failed.Load(),
		l.ok.Load(), l.notServing.Load(), l.refused.Load(), l.failed.Load(), l.errors)
}

func checkHTTP(addr string) error {
	c := http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get("http://" + addr + "/health")
	if err != nil {
		return err
	}
	resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
		return nil
	case http.StatusServiceUnavailable:
		return errNotServing
	}
	return fmt.Errorf("HTTP %d", resp.StatusCode)
}

func checkGRPC(addr string) error {
	// A fresh connection per check, as grpc-health-probe and kubelet make.
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", a)
		}))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(false))
	if err != nil {
		if strings.Contains(err.Error(), "connection refused") {
			return fmt.Errorf("%w: %v", syscall.ECONNREFUSED, err)
		}
		return err
	}
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return errNotServing
	}
	return nil
}

// healthVersion returns the version /health reports.
func healthVersion(t *testing.T, d *daemon) string {
	t.Helper()
	_, body, err := d.get("/health")
	if err != nil {
		t.Fatal(err)
	}
	_, after, _ := strings.Cut(body, `"version":"`)
	v, _, _ := strings.Cut(after, `"`)
	return v
}

// upgradeRounds is how many SIGHUP upgrades TestUpgradeOnSIGHUPRefusesNoConnection
// makes: 3 in the test suite, 20 with PHASEGATE_UPGRADE_LONG=1 (make reliability).
func upgradeRounds() int {
	if os.Getenv("PHASEGATE_UPGRADE_LONG") == "1" {
		return 20
	}
	return 3
}

// SIGHUP upgrades the daemon in place: the same pid runs the binary now at
// its path, and not one health check meets a refused or dropped connection
// across the upgrades (NOT_SERVING while it restarts is an answer).
func TestUpgradeOnSIGHUPRefusesNoConnection(t *testing.T) {
	h := newHost(t)
	bin := filepath.Join(t.TempDir(), "phasegate")
	run(t, "cp", binary, bin)
	v2 := filepath.Join(t.TempDir(), "phasegate-v2")
	run(t, "go", "build", "-race", "-ldflags=-X main.version=v2-upgraded", "-o", v2, "github.com/phasegate/phasegate/cmd/phasegate")

	addr := freePort(t)
	d := startBinary(t, bin, nil, h.args(addr, "--slots=64", "--drain-delay=100ms")...)
	d.waitServing(time.Minute)
	pid := d.Pid()

	load := startCheckLoad(addr, 500)
	rounds := upgradeRounds()
	for round := 1; round <= rounds; round++ {
		if round == rounds {
			// The last round upgrades to another build, as an operator does.
			run(t, "cp", v2, bin+".new")
			if err := os.Rename(bin+".new", bin); err != nil {
				t.Fatal(err)
			}
		}
		before := strings.Count(d.Output(), "SIGHUP: upgrading in place")
		d.signal(syscall.SIGHUP)
		waitFor(t, time.Minute, "the upgrade to begin", func() bool {
			return strings.Count(d.Output(), "SIGHUP: upgrading in place") > before
		})
		waitFor(t, 2*time.Minute, "the upgraded daemon to serve", func() bool {
			return strings.Count(d.Output(), "msg=serving ") > round
		})
		d.waitServing(time.Minute)
	}
	time.Sleep(500 * time.Millisecond) // checks on the served image too
	report := load.finish()
	t.Log(report)
	writeReport(t, "upgrade.txt", fmt.Sprintf("%d SIGHUP upgrades under 500 checks/s (each on a new connection, HTTP and gRPC alternating): %s\n", rounds, report))

	if load.refused.Load() != 0 || load.failed.Load() != 0 {
		t.Errorf("checks refused or failed across the upgrades: %s", report)
	}
	if load.ok.Load() == 0 {
		t.Errorf("no check was answered SERVING: %s", report)
	}
	select {
	case <-d.Done():
		t.Fatalf("the daemon's process %d exited during the upgrades", pid)
	default:
	}
	if v := healthVersion(t, d); v != "v2-upgraded" {
		t.Errorf("after upgrading to v2 /health says version %q", v)
	}
	// The CIDR lock went across the upgrades with the process: a daemon of
	// another prefix on the same CIDR is refused, naming it.
	other := newHost(t)
	o := start(t, nil, other.args(freePort(t), "--slots=64", "--slot-cidr="+h.cidr)...)
	refusedAtStart(t, o, other, "pid "+strconv.Itoa(pid))
	d.signal(syscall.SIGTERM)
	if code := d.wait(time.Minute); code != 0 {
		t.Fatalf("exit %d after the upgrades", code)
	}
}

// A binary that fails its check is not executed: the daemon keeps serving
// and says why. A second SIGHUP during an upgrade is refused.
func TestUpgradeRefusedForABrokenBinaryOrDuringAnUpgrade(t *testing.T) {
	h := newHost(t)
	bin := filepath.Join(t.TempDir(), "phasegate")
	run(t, "cp", binary, bin)
	addr := freePort(t)
	d := startBinary(t, bin, nil, h.args(addr, "--slots=64", "--drain-delay=500ms")...)
	d.waitServing(time.Minute)

	good := bin + ".good"
	if err := os.Rename(bin, good); err != nil {
		t.Fatal(err)
	}
	for _, broken := range []struct {
		name  string
		write func() error
	}{
		{"missing", func() error { return nil }},
		{"exits 3", func() error { return os.WriteFile(bin, []byte("#!/bin/sh\necho broken build >&2\nexit 3\n"), 0o755) }},
		{"not executable", func() error { return os.WriteFile(bin, []byte("\x7fELF garbage"), 0o755) }},
	} {
		if err := broken.write(); err != nil {
			t.Fatal(err)
		}
		before := strings.Count(d.Output(), "upgrade refused, the new binary failed its check")
		d.signal(syscall.SIGHUP)
		waitFor(t, time.Minute, "the upgrade to be refused ("+broken.name+")", func() bool {
			return strings.Count(d.Output(), "upgrade refused, the new binary failed its check") > before
		})
		if code, _, err := d.get("/readyz"); err != nil || code != http.StatusOK {
			t.Fatalf("%s: not serving after a refused upgrade: %d %v", broken.name, code, err)
		}
		_ = os.Remove(bin)
	}
	if err := os.Rename(good, bin); err != nil {
		t.Fatal(err)
	}

	// Two SIGHUPs at once: one upgrade, the second refused.
	d.signal(syscall.SIGHUP)
	waitFor(t, time.Minute, "the upgrade to begin", func() bool {
		return strings.Contains(d.Output(), "SIGHUP: upgrading in place")
	})
	d.signal(syscall.SIGHUP)
	waitFor(t, 2*time.Minute, "the second SIGHUP to be refused", func() bool {
		l := d.Output()
		return strings.Contains(l, "SIGHUP during a drain or an upgrade: refused") ||
			strings.Contains(l, "SIGHUP during the start: upgrade refused")
	})
	d.waitServing(time.Minute)
	if n := strings.Count(d.Output(), "upgrading in place: exec"); n != 1 {
		t.Errorf("%d execs, want 1", n)
	}
	d.signal(syscall.SIGTERM)
	if code := d.wait(time.Minute); code != 0 {
		t.Fatalf("exit %d", code)
	}
}

// Under systemd socket activation the daemon serves on the socket it was
// handed instead of binding its own (which failed "address already in use"
// before), and the port answers before the daemon even runs.
func TestSocketActivation(t *testing.T) {
	activate := lookTool(t, "systemd-socket-activate", "apt-get install systemd")
	h := newHost(t)
	addr := freePort(t)
	args := append([]string{"-l", addr, "--fdname=listen", binary}, h.args(addr, "--slots=64")...)
	d := &daemon{Process: startCmd(t, exec.Command(activate, args...)), t: t, addr: addr}
	// The socket is there before the daemon: the first connection starts it.
	waitFor(t, 30*time.Second, "the activation socket", func() bool {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	d.waitServing(time.Minute)
	if l := d.Output(); strings.Contains(l, "address already in use") || !strings.Contains(l, "listening addr="+addr) {
		t.Fatalf("daemon did not serve the activated socket:\n%s", l)
	}
	d.signal(syscall.SIGTERM)
	if code := d.wait(time.Minute); code != 0 {
		t.Fatalf("exit %d", code)
	}
}

// A socket handed over is served whatever --listen says, so the plain-text
// rule applies to its address: a non-loopback socket without TLS is
// refused (exit 2), as a non-loopback --listen is.
func TestSocketActivationRefusesPlainTextOffLoopback(t *testing.T) {
	activate := lookTool(t, "systemd-socket-activate", "apt-get install systemd")
	h := newHost(t)
	n := newNode(t)
	addr := n.ip.String() + ":5008"
	args := append([]string{"-l", addr, "--fdname=listen", binary}, h.args("127.0.0.1:5008", "--slots=64")...)
	d := n.start(addr, n.command(os.Environ(), append([]string{activate}, args...)...))
	// The socket is there before the daemon: the first connection starts it.
	waitFor(t, 30*time.Second, "the activation socket", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		c, err := n.dial(ctx, "tcp", addr)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	if code := d.wait(time.Minute); code != 2 {
		t.Fatalf("exit %d for a plain-text socket off loopback, want 2:\n%s", code, d.Output())
	}
	if l := d.Output(); !strings.Contains(l, "handed over is "+addr+", not a loopback address") {
		t.Errorf("the refusal does not name the socket:\n%s", l)
	}
}
