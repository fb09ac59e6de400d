package test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// fds counts the daemon's open file descriptors.
func (d *daemon) fds() int {
	entries, err := os.ReadDir("/proc/" + strconv.Itoa(d.Pid()) + "/fd")
	if err != nil {
		return -1
	}
	return len(entries)
}

// goroutines reads go_goroutines from /metrics, or -1 if it is not there.
func (d *daemon) goroutines() int {
	_, body, err := d.get("/metrics")
	if err != nil {
		return -1
	}
	for _, l := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(l, "go_goroutines "); ok {
			n, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return int(n)
		}
	}
	return -1
}

// TestHostileClientsOnThePort throws bad clients at the one port while a
// well-behaved checker keeps asking: the bad connections are closed, the
// checker is always answered, and no descriptor or goroutine is left.
func TestHostileClientsOnThePort(t *testing.T) {
	h := newHost(t)
	addr := freePort(t)
	d := start(t, nil, h.args(addr, "--slots=64")...)
	d.waitServing(time.Minute)
	fdsBefore, grBefore := d.fds(), d.goroutines()

	// The checker: health over HTTP and gRPC, all along.
	checker := startHealthChecker(addr)
	results := runAttacks(hostileAttacks(t, addr))
	checker.stop()
	lines := checkAttackResults(t, results)
	checks, failures := checker.checks.Load(), checker.failures.Load()
	if failures > 0 {
		t.Errorf("%d of %d health checks failed while under attack; first: %v", failures, checks, checker.firstFailure.Load())
	}

	// Everything the attacks opened is closed again.
	waitFor(t, 30*time.Second, "descriptors and goroutines to settle", func() bool {
		return d.fds() <= fdsBefore+2 && (grBefore < 0 || d.goroutines() <= grBefore+5)
	})
	fdsAfter, grAfter := d.fds(), d.goroutines()
	t.Logf("attacks:\n%s\nchecker: %d checks, %d failed; fds %d → %d; goroutines %d → %d",
		strings.Join(lines, "\n"), checks, failures, fdsBefore, fdsAfter, grBefore, grAfter)
	writeReport(t, "hostile.txt", fmt.Sprintf("%s\nchecker: %d checks, %d failed; fds %d -> %d; goroutines %d -> %d\n",
		strings.Join(lines, "\n"), checks, failures, fdsBefore, fdsAfter, grBefore, grAfter))

	d.signal(syscall.SIGTERM)
	if code := d.wait(30 * time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
}

// healthChecker is a well-behaved checker asking GET /health every 5 ms
// until stopped, counting the checks and the failures.
type healthChecker struct {
	cancel           context.CancelFunc
	wg               sync.WaitGroup
	checks, failures atomic.Int64
	firstFailure     atomic.Value
}

// startHealthChecker starts checking addr's /health.
func startHealthChecker(addr string) *healthChecker {
	ctx, cancel := context.WithCancel(context.Background())
	hc := &healthChecker{cancel: cancel}
	hc.wg.Go(func() {
		c := &http.Client{Timeout: 5 * time.Second}
		for ctx.Err() == nil {
			resp, err := c.Get("http://" + addr + "/health")
			hc.checks.Add(1)
			if err != nil || resp.StatusCode != http.StatusOK {
				hc.failures.Add(1)
				hc.firstFailure.CompareAndSwap(nil, fmt.Sprint(err, resp))
			}
			if resp != nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			time.Sleep(5 * time.Millisecond)
		}
	})
	return hc
}

// stop ends the checks and waits for the last.
func (hc *healthChecker) stop() {
	hc.cancel()
	hc.wg.Wait()
}

// hostileAttack is a bad client: run returns what the server answered and
// whether it closed the connection.
type hostileAttack struct {
	name string
	run  func() (string, bool)
}

// attackResult is what one attack got.
type attackResult struct {
	name   string
	answer string
	closed bool
}

// hostileAttacks are the bad clients thrown at addr: garbage, oversized
// headers, slowloris, a silent connection, a half-open one, an unknown
// method and path, and a bad HTTP/2 preface.
func hostileAttacks(t *testing.T, addr string) []hostileAttack {
	dialRaw := func() net.Conn {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	return []hostileAttack{
		{"garbage", func() (string, bool) {
			c := dialRaw()
			_, _ = c.Write([]byte("\x00\x01\x02 this is not HTTP \xff\xfe\r\n\r\n"))
			return closedWithin(c, 20*time.Second)
		}},
		{"oversized headers", func() (string, bool) {
			c := dialRaw()
			_, _ = fmt.Fprintf(c, "GET /health HTTP/1.1\r\nHost: x\r\nX-Big: %s\r\n\r\n", strings.Repeat("a", 2<<20))
			return closedWithin(c, 20*time.Second)
		}},
		{"slowloris", func() (string, bool) {
			c := dialRaw()
			_, _ = c.Write([]byte("GET /health HTTP/1.1\r\nHost: x\r\n"))
			deadline := time.Now().Add(20 * time.Second)
			for time.Now().Before(deadline) {
				if _, err := c.Write([]byte("X-Slow: 1\r\n")); err != nil {
					return "", true // the server hung up on us
				}
				time.Sleep(500 * time.Millisecond)
			}
			return closedWithin(c, time.Second)
		}},
		{"silent", func() (string, bool) { return closedWithin(dialRaw(), 20*time.Second) }},
		{"half-open", func() (string, bool) {
			c := dialRaw()
			_, _ = c.Write([]byte("GET /hea"))
			_ = c.(*net.TCPConn).CloseWrite()
			return closedWithin(c, 20*time.Second)
		}},
		{"unknown method", func() (string, bool) {
			c := dialRaw()
			_, _ = c.Write([]byte("BREW /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"))
			return closedWithin(c, 20*time.Second)
		}},
		{"unknown path", func() (string, bool) {
			c := dialRaw()
			_, _ = c.Write([]byte("GET /etc/passwd HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"))
			return closedWithin(c, 20*time.Second)
		}},
		{"bad HTTP/2 preface", func() (string, bool) {
			c := dialRaw()
			_, _ = c.Write([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x12\x04\x00\x00\x00\x00\x00garbage-frames"))
			return closedWithin(c, 20*time.Second)
		}},
	}
}

// closedWithin reads until the server closes c, answering what it sent.
// A reset (the server closing with our data unread) is a close too; only
// running into the deadline means the server kept the connection.
func closedWithin(c net.Conn, d time.Duration) (string, bool) {
	_ = c.SetReadDeadline(time.Now().Add(d))
	b, err := io.ReadAll(c)
	return string(b), err == nil || errors.Is(err, syscall.ECONNRESET)
}

// runAttacks runs every attack at once and returns what each got.
func runAttacks(attacks []hostileAttack) []attackResult {
	var results []attackResult
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, a := range attacks {
		wg.Go(func() {
			answer, closed := a.run()
			mu.Lock()
			results = append(results, attackResult{a.name, answer, closed})
			mu.Unlock()
		})
	}
	wg.Wait()
	return results
}

// checkAttackResults checks every attack's connection was closed by the
// server, the ones it can answer with the status they deserve, and
// returns a line for each.
func checkAttackResults(t *testing.T, results []attackResult) []string {
	t.Helper()
	want := map[string]string{
		"oversized headers": "431",
		"unknown method":    "405",
		"unknown path":      "404",
		"garbage":           "400",
	}
	var lines []string
	for _, r := range results {
		status := ""
		if sl, _, _ := strings.Cut(r.answer, "\r\n"); strings.HasPrefix(sl, "HTTP/") {
			status = strings.Fields(sl)[1]
		}
		lines = append(lines, fmt.Sprintf("%-20s closed=%v status=%q", r.name, r.closed, status))
		if !r.closed {
			t.Errorf("%s: connection not closed by the server", r.name)
		}
		if w, ok := want[r.name]; ok && status != w {
			t.Errorf("%s: answered %q, want %s", r.name, status, w)
		}
	}
	return lines
}
