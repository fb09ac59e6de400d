package test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
)

// nsOfPid is the inode of process pid's network namespace.
func nsOfPid(t *testing.T, pid int) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &st); err != nil {
		t.Fatalf("namespace of pid %d: %v", pid, err)
	}
	return st.Ino
}

// Leased slots broken from outside while the daemon runs are seen within
// one reconcile pass (10 s by default): a namespace file deleted as `ip
// netns del` does (unmount and unlink; the tool works in /run/netns only)
// and one unmounted are LOST, with the reason, on Get and List; a host
// link deleted is made again into its intact namespace, and its workload
// answers again. Each is an audit line, a lease event, the lost-leases
// gauge and the slots-broken health warning, and every workload's process
// lives on in its own namespace. Releasing a lost lease tears its remains
// down and frees its index. On 3e89cc8 all three stayed ACQUIRED, the
// gauge 0, nothing was logged.
func TestLeasedSlotsBrokenFromOutsideAreSeen(t *testing.T) {
	h := newHost(t)
	d := start(t, nil, h.args(freePort(t), "--slots=64")...)
	d.waitServing(time.Minute)
	r := &brokenRig{c: d.slots(), leases: map[string]held{}, work: map[string]*workload{}, pids: map[string]int{}}
	for _, n := range brokenNames {
		l := acquire(t, r.c, "tenant-"+n, n, 0)
		inside, _, _ := strings.Cut(l.slot.GetInsideAddress(), "/")
		r.leases[n], r.work[n] = l, startWorkload(t, l.slot.GetIndex(), l.slot.GetNetnsPath(), inside)
	}
	for _, n := range brokenNames {
		r.pids[n] = workloadPid(t, r.leases[n].slot.GetNetnsPath())
	}

	broke := time.Now()
	nsDeleted := r.leases["netns-deleted"].slot.GetNetnsPath()
	run(t, "umount", "-l", nsDeleted) // what ip netns del does: detach, then unlink
	if err := os.Remove(nsDeleted); err != nil {
		t.Fatal(err)
	}
	run(t, "ip", "link", "del", r.leases["link-deleted"].slot.GetHostInterface())
	run(t, "umount", r.leases["unmounted"].slot.GetNetnsPath())

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r.t, r.ctx = t, ctx
	seen := func() bool {
		return r.get("netns-deleted").GetState() == phasegatev1.SlotState_SLOT_STATE_LOST &&
			r.get("unmounted").GetState() == phasegatev1.SlotState_SLOT_STATE_LOST &&
			strings.Contains(strings.Join(r.get("link-deleted").GetRepaired(), ","), "host link")
	}
	// One pass: the next one after the breaks, at most 10 s away, and
	// its own time (seconds, on a loaded machine with the race detector).
	waitFor(t, 20*time.Second, "every broken slot seen within a reconcile pass", seen)
	t.Logf("seen %v after the breaks", time.Since(broke).Round(time.Millisecond))

	r.checkStates(t)
	r.checkSignals(t, d)
	r.checkWorkloadsLiveOn(t)
	r.releaseLost(t, h)
	d.signal(syscall.SIGTERM)
	if code := d.wait(time.Minute); code != 0 {
		t.Fatalf("exit %d", code)
	}
	h.decommission(h.prefix)
	h.assertClean(h.prefix, nil)
}

// brokenNames are TestLeasedSlotsBrokenFromOutsideAreSeen's leases, each
// named for what is done to its slot.
var brokenNames = []string{"netns-deleted", "link-deleted", "unmounted", "intact"}

// brokenRig is the leases of brokenNames, their workloads and the
// workloads' pids, on the daemon's Slots API c.
type brokenRig struct {
	t      *testing.T
	ctx    context.Context
	c      phasegatev1.SlotsClient
	leases map[string]held
	work   map[string]*workload
	pids   map[string]int
}

// get is the Slots API's Get of lease n's slot.
func (r *brokenRig) get(n string) *phasegatev1.Slot {
	r.t.Helper()
	resp, err := r.c.Get(r.ctx, &phasegatev1.GetRequest{Index: r.leases[n].slot.GetIndex()})
	if err != nil {
		r.t.Fatalf("Get %s: %v", n, err)
	}
	return resp.GetSlot()
}

// checkStates checks Get and List: the deleted and the unmounted
// namespaces LOST with their reason, the relinked slot and the intact one
// ACQUIRED.
func (r *brokenRig) checkStates(t *testing.T) {
	t.Helper()
	for n, why := range map[string]string{"netns-deleted": "was deleted from outside", "unmounted": "was unmounted"} {
		s := r.get(n)
		if !strings.Contains(s.GetLostReason(), why) || s.GetOwner() != "tenant-"+n {
			t.Errorf("%s: Get says %v owner %q reason %q, want LOST saying %q", n, s.GetState(), s.GetOwner(), s.GetLostReason(), why)
		}
	}
	if s := r.get("link-deleted"); s.GetState() != phasegatev1.SlotState_SLOT_STATE_ACQUIRED {
		t.Errorf("the slot whose host link was made again is %v, want ACQUIRED", s.GetState())
	}
	if s := r.get("intact"); s.GetState() != phasegatev1.SlotState_SLOT_STATE_ACQUIRED || len(s.GetRepaired()) != 0 {
		t.Errorf("the intact slot: %v", s)
	}
	states := map[uint32]phasegatev1.SlotState{}
	for _, s := range listSlots(t, r.c, false) {
		states[s.GetIndex()] = s.GetState()
	}
	for n, want := range map[string]phasegatev1.SlotState{"netns-deleted": phasegatev1.SlotState_SLOT_STATE_LOST,
		"unmounted": phasegatev1.SlotState_SLOT_STATE_LOST, "link-deleted": phasegatev1.SlotState_SLOT_STATE_ACQUIRED,
		"intact": phasegatev1.SlotState_SLOT_STATE_ACQUIRED} {
		if got := states[r.leases[n].slot.GetIndex()]; got != want {
			t.Errorf("List says %s is %v, want %v", n, got, want)
		}
	}
}

// checkSignals checks each break is told: the slots-broken warning
// naming its slot, /health warn, the lost-leases gauge and the repaired
// event, and an audit line naming the owner.
func (r *brokenRig) checkSignals(t *testing.T, d *daemon) {
	t.Helper()
	w := d.warning("slots-broken")
	for _, n := range []string{"netns-deleted", "unmounted", "link-deleted"} {
		if !strings.Contains(w, fmt.Sprint(r.leases[n].slot.GetIndex())) {
			t.Errorf("the slots-broken warning does not name %s's slot %d: %q", n, r.leases[n].slot.GetIndex(), w)
		}
	}
	if _, body, _ := d.get("/health"); !strings.Contains(body, `"status":"warn"`) {
		t.Errorf("/health is not warn: %s", body)
	}
	fams := scrapeMetrics(t, d)
	if v := metricValue(fams, "phasegate_leases", "state", "lost"); v != 2 {
		t.Errorf("phasegate_leases{state=lost} = %v, want 2", v)
	}
	if v := metricValue(fams, "phasegate_lease_events_total", "event", "repaired"); v != 1 {
		t.Errorf("phasegate_lease_events_total{event=repaired} = %v, want 1", v)
	}
	logs := d.Output()
	for n, msg := range map[string]string{"netns-deleted": "lease lost: its slot was broken from outside", "unmounted": "lease lost: its slot was broken from outside",
		"link-deleted": "its slot was broken from outside the daemon and repaired"} {
		line := grepLines(logs, fmt.Sprintf("slot=%d ", r.leases[n].slot.GetIndex()))
		if !strings.Contains(line, msg) || !strings.Contains(line, "audit=true") || !strings.Contains(line, "owner=tenant-"+n) {
			t.Errorf("no audit line for %s's slot:\n%s", n, line)
		}
	}
}

// checkWorkloadsLiveOn checks every workload lives on in its own
// namespace; the one whose host link was made again answers over it; the
// intact one never noticed; the one whose namespace file was deleted kept
// its network.
func (r *brokenRig) checkWorkloadsLiveOn(t *testing.T) {
	t.Helper()
	// Every workload lives on in its own namespace; the one whose host
	// link was made again answers over it; the intact one never noticed.
	for _, n := range brokenNames {
		if err := syscall.Kill(r.pids[n], 0); err != nil {
			t.Errorf("%s: the workload's process is gone: %v", n, err)
		} else if ino := nsOfPid(t, r.pids[n]); ino != r.leases[n].netns {
			t.Errorf("%s: the workload's namespace is %d, was %d", n, ino, r.leases[n].netns)
		}
	}
	for _, n := range []string{"link-deleted", "intact"} {
		var st unix.Stat_t
		if err := unix.Stat(r.leases[n].slot.GetNetnsPath(), &st); err != nil || st.Ino != r.leases[n].netns {
			t.Errorf("%s: the namespace file shows %d (%v), was %d", n, st.Ino, err, r.leases[n].netns)
		}
	}
	relinked := r.work["link-deleted"]
	okBefore := relinked.ok.Load()
	waitFor(t, 10*time.Second, "the workload behind the host link made again to answer", func() bool { return relinked.ok.Load() > okBefore+3 })
	if ok, failed, last := r.work["intact"].finish(); failed != 0 || ok == 0 {
		t.Errorf("the intact slot's workload: %d probes failed (last %v), %d answered", failed, last, ok)
	}
	// The namespace deleted by name lives on with its process, and so does
	// its network: nothing of it was torn down while the lease is held.
	if ok, failed, last := r.work["netns-deleted"].finish(); failed != 0 || ok == 0 {
		t.Errorf("the workload whose namespace file was deleted lost its network while its lease was held: %d failed (last %v), %d answered", failed, last, ok)
	}
}

// releaseLost releases the lost leases and checks their remains are torn
// down and their index freed.
func (r *brokenRig) releaseLost(t *testing.T, h *host) {
	t.Helper()
	// Releasing a lost lease tears its remains down and frees its index.
	for _, n := range []string{"netns-deleted", "unmounted"} {
		l := r.leases[n]
		if _, err := r.c.Release(r.ctx, &phasegatev1.ReleaseRequest{Index: l.slot.GetIndex(), LeaseId: l.leaseID}); err != nil {
			t.Fatalf("Release %s: %v", n, err)
		}
		if links := h.links(l.slot.GetHostInterface()); len(links) != 0 {
			t.Errorf("%s: its host link is left after the release: %v", n, links)
		}
		if s := r.get(n); s.GetState() == phasegatev1.SlotState_SLOT_STATE_LOST || s.GetOwner() != "" {
			t.Errorf("%s after its release: %v", n, s)
		}
	}
}

// workloadPid is the pid of the workload startWorkload runs in the
// namespace at path: the process whose network namespace is the one
// bound there.
func workloadPid(t *testing.T, path string) int {
	t.Helper()
	var ns unix.Stat_t
	if err := unix.Stat(path, &ns); err != nil {
		t.Fatal(err)
	}
	self := os.Args[0]
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscan(e.Name(), &pid); err != nil {
			continue
		}
		var st unix.Stat_t
		if unix.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &st) != nil || st.Ino != ns.Ino || st.Dev != ns.Dev {
			continue
		}
		if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); err == nil && (exe == self || strings.HasSuffix(self, exe)) {
			return pid
		}
	}
	t.Fatalf("no workload process in the namespace at %s", path)
	return 0
}
