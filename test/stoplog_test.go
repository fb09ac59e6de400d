package test

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
)

// A routine stop, a lease kept for the next start, warns of nothing from
// the signal on: the firewall table it keeps for its slots is said at INFO.
// The lease, without a TTL, is logged as having none (not "0s").
func TestRoutineStopLogsNoWarning(t *testing.T) {
	h := newHost(t)
	d := start(t, nil, h.args(freePort(t))...)
	d.waitServing(time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := d.slots().Acquire(ctx, &phasegatev1.AcquireRequest{Owner: "stoplog-1"}); err != nil {
		t.Fatal(err)
	}
	d.signal(syscall.SIGTERM)
	if code := d.wait(time.Minute); code != 0 {
		t.Fatalf("exit %d after SIGTERM:\n%s", code, d.Output())
	}
	// From the signal on: what the start warned of (the host's own
	// settings, which no test may depend on) is not the stop's.
	var stopping, kept, acquired bool
	for _, l := range lines(d.Output()) {
		if strings.Contains(l, `msg="slot acquired"`) && strings.Contains(l, "owner=stoplog-1") {
			acquired = true
			if !strings.Contains(l, "ttl=none") {
				t.Errorf("a lease without a TTL is logged as %s, want ttl=none", l)
			}
		}
		stopping = stopping || strings.Contains(l, "msg=draining")
		if stopping && (strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR")) {
			t.Errorf("a routine stop logged: %s", l)
		}
		kept = kept || (strings.Contains(l, "level=INFO") && strings.Contains(l, "firewall table kept"))
	}
	if !acquired {
		t.Errorf("no slot acquired line for stoplog-1:\n%s", d.Output())
	}
	if !kept {
		t.Errorf("no INFO line says the firewall table was kept:\n%s", d.Output())
	}
}
