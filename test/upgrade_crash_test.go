package test

import (
	"strings"
	"syscall"
	"testing"
	"time"
)

// A SIGHUP upgrade killed (kill -9) at each of its moments — while the old
// image drains, as it execs the new one, while the new image starts,
// once it serves — loses nothing: the next start restores every lease to
// its owner over the same namespace, and the workloads in the slots live
// through it all, answering. (A crash during an upgrade, in
// docs/RELIABILITY.md's table of faults.)
func TestKillDuringAnUpgradeLosesNothing(t *testing.T) {
	h := newHost(t)
	args := h.args(freePort(t), "--slots=64", "--drain-delay=1s")
	d := start(t, nil, args...)
	d.waitServing(time.Minute)
	tenants := leaseWorkloads(t, d.slots(), 3)
	var leases []held
	for _, tn := range tenants {
		leases = append(leases, tn.held)
	}
	for _, point := range []struct {
		name   string
		marker string // the line whose next occurrence after the SIGHUP is the moment
	}{
		{"while the old image drains", `msg=lifecycle state=draining`},
		{"as it execs the new image", `msg="upgrading in place: exec"`},
		{"while the new image starts", `msg=listening `},
		{"once the new image serves", `msg=serving `},
	} {
		seen := strings.Count(d.Output(), point.marker)
		d.signal(syscall.SIGHUP)
		waitFor(t, time.Minute, "the upgrade to reach the moment "+point.name, func() bool {
			return strings.Count(d.Output(), point.marker) > seen
		})
		d.signal(syscall.SIGKILL)
		d.wait(30 * time.Second)
		for _, tn := range tenants {
			tn.survives(t, "killed "+point.name)
		}
		d = start(t, nil, args...)
		d.waitServing(time.Minute)
		checkLeases(t, d.slots(), leases, "the start after a kill "+point.name)
		for _, tn := range tenants {
			tn.survives(t, "the start after a kill "+point.name)
		}
	}
	for _, tn := range tenants {
		ok, failed, last := tn.w.finish()
		if failed != 0 || ok == 0 {
			t.Errorf("workload in slot %d: %d probes failed (last %v), %d answered", tn.slot.GetIndex(), failed, last, ok)
		}
	}
	d.signal(syscall.SIGTERM)
	if code := d.wait(time.Minute); code != 0 {
		t.Fatalf("stop: exit %d", code)
	}
	h.decommission(h.prefix)
}
