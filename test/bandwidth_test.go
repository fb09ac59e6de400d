package test

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
)

// qdiscs is what tc shows at dev's root and ingress ("" for a device that
// is not there).
func (h *host) qdiscs(dev string) string {
	out, err := h.command("tc", "qdisc", "show", "dev", dev).CombinedOutput()
	if err != nil {
		return ""
	}
	return string(out)
}

// A lease's bandwidth limits are kernel state on its slot's host side
// (issue 46, part 2): they outlive a kill -9 of the daemon; a root qdisc
// deleted while the daemon was down is put back by the restored leases'
// check after the restart; a host link deleted from outside is made again
// with its limits; the release, and the decommission at the end, leave no
// ifb.
func TestBandwidthLimitsSurviveRestartsAndRepairs(t *testing.T) {
	h := newHost(t)
	args := h.args(freePort(t), "--slots=8")
	d := start(t, nil, args...)
	d.waitServing(time.Minute)
	c := d.slots()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	resp, err := c.Acquire(ctx, &phasegatev1.AcquireRequest{Owner: "tenant-bw", RequestId: "bw",
		Bandwidth: &phasegatev1.Bandwidth{IngressRate: 40e6, EgressRate: 20e6}})
	if err != nil {
		t.Fatal(err)
	}
	sl := resp.GetSlot()
	hostIf := sl.GetHostInterface()
	ifb := h.prefix + "b" + strings.TrimPrefix(hostIf, h.prefix+"h")
	holds := func() bool {
		return strings.Contains(h.qdiscs(hostIf), "rate 40Mbit") && strings.Contains(h.qdiscs(hostIf), "ingress") &&
			strings.Contains(h.qdiscs(ifb), "rate 20Mbit")
	}
	if !holds() {
		t.Fatalf("after Acquire: %s: %s; %s: %s", hostIf, h.qdiscs(hostIf), ifb, h.qdiscs(ifb))
	}

	d.signal(syscall.SIGKILL)
	d.wait(time.Minute)
	if !holds() {
		t.Fatalf("after kill -9: %s: %s; %s: %s", hostIf, h.qdiscs(hostIf), ifb, h.qdiscs(ifb))
	}
	run(t, "tc", "qdisc", "del", "dev", hostIf, "root")
	d = start(t, nil, args...)
	d.waitServing(time.Minute)
	c = d.slots()
	waitFor(t, 30*time.Second, "the restored lease's limits put back", holds)
	if got := getSlot(t, c, sl.GetIndex()).GetBandwidth(); got.GetIngressRate() != 40e6 || got.GetEgressRate() != 20e6 {
		t.Errorf("after the restart Get shows %v", got)
	}

	run(t, "ip", "link", "del", hostIf)
	waitFor(t, 30*time.Second, "the host link made again", func() bool { return len(h.links(hostIf)) == 1 })
	// With it, not at verify-inside's next pass (up to 30 s later).
	waitFor(t, 2*time.Second, "the new host link's limits", holds)

	if _, err := c.Release(ctx, &phasegatev1.ReleaseRequest{Index: sl.GetIndex(), LeaseId: resp.GetLeaseId()}); err != nil {
		t.Fatal(err)
	}
	if l := h.links(ifb); len(l) != 0 {
		t.Errorf("after the release: %v", l)
	}
	stopCleanly(t, d)
	h.decommission(h.prefix)
	h.assertClean(h.prefix, nil)
}
