package test

import (
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The daemon checks, once it serves, what its slots' egress needs and says
// what is missing, with the command that fixes it, in the log and as a
// /health warning (200 "warn": it serves, but its slots cannot reach the
// outside).
// It runs in a namespace that plays the node, so the test controls the
// node's forwarding without touching this machine's.
func TestEgressPrerequisitesAreReported(t *testing.T) {
	n := newNode(t)
	// A default route, so that only forwarding is missing.
	run(t, "nsenter", "--net="+n.ns, "--", "ip", "route", "add", "default", "dev", "node0")
	health := func(addr string) (int, string) {
		t.Helper()
		var code int
		var body string
		waitPass(t, time.Minute, "/health", func() error {
			c := http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DialContext: n.dial, DisableKeepAlives: true}}
			resp, err := c.Get("http://" + addr + "/health")
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			code, body = resp.StatusCode, string(b)
			if code != http.StatusOK {
				return errNotServing
			}
			return nil
		})
		return code, body
	}
	for _, tc := range []struct {
		forward string
		warn    bool
	}{{"0", true}, {"1", false}} {
		run(t, "nsenter", "--net="+n.ns, "--", "sysctl", "-q", "-w", "net.ipv4.ip_forward="+tc.forward)
		h := newHost(t)
		addr := "127.0.0.1:5008"
		d := n.start(addr, n.command(baseEnv(), append([]string{binary}, h.args(addr, "--slots=64")...)...))
		waitPass(t, time.Minute, "the egress check", func() error {
			if !strings.Contains(d.Output(), "egress check done") {
				return errNotServing
			}
			return nil
		})
		code, body := health(addr)
		hasWarning := strings.Contains(body, `"status":"warn"`) && strings.Contains(body, "warning:egress") &&
			strings.Contains(body, "sysctl -w net.ipv4.ip_forward=1")
		if hasWarning != tc.warn || code != http.StatusOK {
			t.Errorf("ip_forward=%s: /health %d, egress warning %v, want %v:\n%s", tc.forward, code, hasWarning, tc.warn, body)
		}
		if logged := strings.Contains(d.Output(), "egress check: slots cannot reach the outside"); logged != tc.warn {
			t.Errorf("ip_forward=%s: egress logged %v, want %v", tc.forward, logged, tc.warn)
		}
		d.signal(syscall.SIGTERM)
		if code := d.wait(time.Minute); code != 0 {
			t.Fatalf("exit %d", code)
		}
		h.decommission(h.prefix)
	}
}
