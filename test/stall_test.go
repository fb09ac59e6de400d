package test

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
)

// A daemon stopped (SIGSTOP) past a lease's TTL does not expire the lease
// when it runs again: its owner could not renew it meanwhile, so the
// expiry is deferred by a TTL (DESIGN.md §10, "Expiry while impaired"),
// logged, and a renewal then keeps the lease; the lease's slot and its
// workload are untouched, and the daemon serves as soon as it runs. This
// held on 3e89cc8 too (the "What held"): kept here so that it
// goes on holding.
func TestStoppedDaemonDefersExpiry(t *testing.T) {
	h := newHost(t)
	d := start(t, nil, h.args(freePort(t), "--slots=64")...)
	d.waitServing(time.Minute)
	c := d.slots()
	const ttl = 3 * time.Second
	l := acquire(t, c, "tenant-ttl", "stopped", ttl)
	inside, _, _ := strings.Cut(l.slot.GetInsideAddress(), "/")
	w := startWorkload(t, l.slot.GetIndex(), l.slot.GetNetnsPath(), inside)

	d.signal(syscall.SIGSTOP)
	t.Cleanup(func() { d.signal(syscall.SIGCONT) })
	// Stopped until the lease is a whole TTL past its deadline, with
	// nobody to renew it with: the time passing is the condition.
	time.Sleep(time.Until(l.slot.GetExpiresAt().AsTime().Add(ttl)))
	d.signal(syscall.SIGCONT)
	d.waitServing(30 * time.Second)
	waitFor(t, 10*time.Second, "the late expiry loop to say so", func() bool {
		return strings.Contains(d.Output(), "lease expiry ran late")
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.KeepAlive(ctx, &phasegatev1.KeepAliveRequest{Index: l.slot.GetIndex(), LeaseId: l.leaseID}); err != nil {
		t.Fatalf("KeepAlive after the daemon ran again: %v (the lease expired while its owner could not renew it)", err)
	}
	checkLeases(t, c, []held{l}, "after SIGSTOP and SIGCONT")
	if strings.Contains(d.Output(), `msg="lease expired`) {
		t.Errorf("a lease expired while its owner could not renew it:\n%s", grepLines(d.Output(), "lease expired"))
	}
	if ok, failed, last := w.finish(); failed != 0 || ok == 0 {
		t.Errorf("the workload lost its network: %d probes failed (last %v), %d answered", failed, last, ok)
	}
	if _, err := c.Release(ctx, &phasegatev1.ReleaseRequest{Index: l.slot.GetIndex(), LeaseId: l.leaseID}); err != nil {
		t.Fatalf("Release: %v", err)
	}
	d.signal(syscall.SIGTERM)
	if code := d.wait(time.Minute); code != 0 {
		t.Fatalf("exit %d", code)
	}
	h.decommission(h.prefix)
	h.assertClean(h.prefix, nil)
}
