package test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
)

// warning returns the detail of the daemon's health warning name, "" when
// it has none.
func (d *daemon) warning(name string) string {
	code, body, err := d.get("/readyz/warning/" + name)
	if err != nil || code != http.StatusOK {
		return ""
	}
	detail, ok := strings.CutPrefix(strings.TrimSpace(body), "warn: ")
	if !ok {
		return ""
	}
	return detail
}

// A node with every slot index leased is a normal state: the daemon
// serves at once after a kill -9, a SIGTERM and start, and a SIGHUP
// upgrade, with every lease and its namespace kept and the workloads
// answering throughout; health says the pool is empty because the node is
// full (and the metric: nothing idle, nothing free); an Acquire fails at
// once with ResourceExhausted; a release refills the pool. On 3e89cc8 each
// start waited in populate for a warm slot no index could give, and
// exited 1 after 3 × 1 min.
func TestFullNodeRestartsAndServesAtOnce(t *testing.T) {
	const slots = 32
	h := newHost(t)
	args := h.args(freePort(t), fmt.Sprintf("--slots=%d", slots), "--pool-size=2")
	d := start(t, nil, args...)
	d.waitServing(time.Minute)
	c := d.slots()
	var leases []held
	for i := range slots {
		leases = append(leases, acquire(t, c, fmt.Sprintf("tenant-%d", i%5), fmt.Sprintf("full-%d", i), 0))
	}
	var work []*workload
	for _, l := range leases[:3] {
		inside, _, _ := strings.Cut(l.slot.GetInsideAddress(), "/")
		work = append(work, startWorkload(t, l.slot.GetIndex(), l.slot.GetNetnsPath(), inside))
	}

	full := func(when string) { t.Helper(); checkFullNode(t, d, c, leases, when) }
	full("full, before any restart")

	restart := func(name string, stop func()) {
		t.Helper()
		stop()
		began := time.Now()
		d = start(t, nil, args...)
		d.waitServing(30 * time.Second) // 3e89cc8: 3 min 3 s, then exit 1
		t.Logf("after %s: serving in %v", name, time.Since(began).Round(time.Millisecond))
		c = d.slots()
		full("after " + name)
	}
	restart("kill -9", func() {
		d.signal(syscall.SIGKILL)
		d.wait(30 * time.Second)
	})
	restart("SIGTERM and start", func() {
		d.signal(syscall.SIGTERM)
		if code := d.wait(time.Minute); code != 0 {
			t.Fatalf("exit %d", code)
		}
	})
	before := strings.Count(d.Output(), "msg=serving ")
	d.signal(syscall.SIGHUP)
	waitFor(t, 30*time.Second, "the upgraded daemon to serve", func() bool {
		return strings.Count(d.Output(), "msg=serving ") > before
	})
	d.waitServing(30 * time.Second)
	full("after a SIGHUP upgrade")

	// A release refills the pool, and the warning goes.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	last := leases[len(leases)-1]
	if _, err := c.Release(ctx, &phasegatev1.ReleaseRequest{Index: last.slot.GetIndex(), LeaseId: last.leaseID}); err != nil {
		t.Fatalf("Release: %v", err)
	}
	leases = leases[:len(leases)-1]
	waitFor(t, 30*time.Second, "a warm slot after the release", func() bool {
		return metricValue(scrapeMetrics(t, d), "phasegate_pool_slots", "state", "idle") == 1
	})
	if w := d.warning("pool"); w != "" {
		t.Errorf("the pool warning after a release refilled the pool: %s", w)
	}
	again := acquire(t, c, "tenant-new", "after-release", 0)
	leases = append(leases, again)
	checkLeases(t, c, leases, "after a release and an Acquire")

	for _, w := range work {
		ok, failed, lastErr := w.finish()
		if failed != 0 || ok == 0 {
			t.Errorf("workload in slot %d lost its network: %d probes failed (last: %v), %d answered", w.slot, failed, lastErr, ok)
		}
	}
	d.signal(syscall.SIGTERM)
	if code := d.wait(time.Minute); code != 0 {
		t.Fatalf("exit %d", code)
	}
	h.decommission(h.prefix)
	h.assertClean(h.prefix, nil)
}

// checkFullNode checks what a full node says of itself (when says when):
// the leases, health's pool warning, the metric (nothing idle, nothing
// free), and an Acquire refused at once.
func checkFullNode(t *testing.T, d *daemon, c phasegatev1.SlotsClient, leases []held, when string) {
	t.Helper()
	checkLeases(t, c, leases, when)
	waitFor(t, 30*time.Second, when+": the pool warning", func() bool {
		return strings.Contains(d.warning("pool"), "the node is full")
	})
	if _, body, _ := d.get("/health"); !strings.Contains(body, `"status":"warn"`) {
		t.Errorf("%s: /health is not warn: %s", when, body)
	}
	fams := scrapeMetrics(t, d)
	for _, state := range []string{"idle", "free"} {
		if v := metricValue(fams, "phasegate_pool_slots", "state", state); v != 0 {
			t.Errorf("%s: phasegate_pool_slots{state=%q} = %v, want 0", when, state, v)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	began := time.Now()
	_, err := c.Acquire(ctx, &phasegatev1.AcquireRequest{Owner: "one-too-many", RequestId: strings.ReplaceAll(when, " ", "-")})
	if status.Code(err) != codes.ResourceExhausted || time.Since(began) > 5*time.Second {
		t.Errorf("%s: Acquire on a full node = %v after %v, want ResourceExhausted at once", when, err, time.Since(began))
	}
}
