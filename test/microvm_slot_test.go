package test

import (
	"context"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
	"github.com/phasegate/phasegate/network/leases"
)

// e2eGuest is the guest device of these tests: E2B's shape in a range no
// test's slots use (nettest playgrounds put /31 routes on the host in
// 169.254.0.0/17, which the daemon rightly refuses a guest network in).
var e2eGuest = []string{"--slot-guest-tap=tap0", "--slot-guest-addr=169.254.255.21/30", "--slot-guest-gateway=169.254.255.22"}

// insideRules is the slot's nftables ruleset with the handles of its
// rules (a rule written again gets a new handle) and without the counter
// values (which traffic changes).
func insideRules(t *testing.T, netnsPath string) string {
	t.Helper()
	out, err := exec.Command("nsenter", "--net="+netnsPath, "nft", "-a", "list", "ruleset").CombinedOutput()
	if err != nil {
		t.Fatalf("nft list ruleset in %s: %v\n%s", netnsPath, err, out)
	}
	var keep []string
	for _, l := range strings.Split(string(out), "\n") {
		if !strings.Contains(l, "packets ") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}

func tapIndex(t *testing.T, netnsPath string) string {
	t.Helper()
	out, err := exec.Command("nsenter", "--net="+netnsPath, "ip", "-o", "link", "show", "tap0").CombinedOutput()
	if err != nil {
		t.Fatalf("no tap0 in %s: %v\n%s", netnsPath, err, out)
	}
	idx, _, _ := strings.Cut(string(out), ":")
	return idx
}

func getSlot(t *testing.T, c phasegatev1.SlotsClient, i uint32) *phasegatev1.Slot {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := c.Get(ctx, &phasegatev1.GetRequest{Index: i})
	if err != nil {
		t.Fatalf("Get(%d): %v", i, err)
	}
	return r.GetSlot()
}

// A lease acquired with an egress policy in a slot with a guest device
// keeps its policy, its rules (the very same rules, not rewritten) and its
// tap across kill -9, SIGTERM and SIGHUP; Get shows the policy; Release
// takes everything away.
func TestMicroVMSlotPolicyAcrossRestarts(t *testing.T) {
	r := newMicroVMRig(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r.acquire(t, ctx)
	r.restart(t, "kill -9", func() int {
		r.d.signal(syscall.SIGKILL)
		r.d.wait(30 * time.Second)
		r.d = start(t, nil, r.args...)
		return 0
	})
	r.restart(t, "SIGTERM", func() int {
		r.d.signal(syscall.SIGTERM)
		if code := r.d.wait(time.Minute); code != 0 {
			t.Fatalf("exit %d", code)
		}
		r.d = start(t, nil, r.args...)
		return 0
	})
	r.restart(t, "SIGHUP", func() int {
		base := strings.Count(r.d.Output(), insideVerifiedMarker)
		serving := strings.Count(r.d.Output(), "msg=serving ")
		r.d.signal(syscall.SIGHUP)
		waitFor(t, 2*time.Minute, "the upgraded daemon to serve", func() bool {
			return strings.Count(r.d.Output(), "msg=serving ") > serving
		})
		return base
	})
	r.repairMissingTables(t)
	r.denyAllRecorded(t, ctx)

	// Release: the slot, its tap and its tables go with the namespace.
	r.d = start(t, nil, r.args...)
	r.d.waitServing(time.Minute)
	r.c = r.d.slots()
	if _, err := r.c.Release(ctx, &phasegatev1.ReleaseRequest{Index: r.i, LeaseId: r.leaseID}); err != nil {
		t.Fatal(err)
	}
	if got := getSlot(t, r.c, r.i); got.GetEgressPolicy() != nil || got.GetOwner() != "" {
		t.Errorf("after Release Get shows %v", got)
	}
	r.d.signal(syscall.SIGTERM)
	r.d.wait(time.Minute)
	r.h.stoppedCleanly(r.h.prefix, nil)
}

// insideVerifiedMarker is the daemon's line once it has verified the
// inside of its restored leases' slots.
const insideVerifiedMarker = "restored leases: inside of their slots verified"

// microVMRig is a daemon with a guest device in its slots (d, restarted
// along the test, and its client c) and the lease of vm-1 with an egress
// policy at slot i: its namespace's path, the rules and the tap's index
// found there, and the policy Get must show.
type microVMRig struct {
	h       *host
	args    []string
	d       *daemon
	c       phasegatev1.SlotsClient
	i       uint32
	leaseID string
	path    string
	rules   string
	tap     string
	want    *phasegatev1.EgressPolicy
}

// newMicroVMRig starts the daemon with a guest device in its slots.
func newMicroVMRig(t *testing.T) *microVMRig {
	t.Helper()
	h := newHost(t)
	r := &microVMRig{h: h, args: h.args(freePort(t), append([]string{"--slots=16"}, e2eGuest...)...)}
	r.d = start(t, nil, r.args...)
	r.d.waitServing(time.Minute)
	r.c = r.d.slots()
	return r
}

// acquire acquires vm-1's lease with an egress policy, checking Get shows
// the policy, normalized, and the guest, and the slot's rules hold the
// guest NAT and the policy.
func (r *microVMRig) acquire(t *testing.T, ctx context.Context) {
	t.Helper()
	policy := &phasegatev1.EgressPolicy{Allow: []string{"1.1.1.1", "192.0.2.0/24"}, Deny: []string{"203.0.113.0/24"}}
	resp, err := r.c.Acquire(ctx, &phasegatev1.AcquireRequest{Owner: "vm-1", RequestId: "r1", EgressPolicy: policy})
	if err != nil {
		t.Fatal(err)
	}
	r.i, r.leaseID = resp.GetSlot().GetIndex(), resp.GetLeaseId()
	sl := getSlot(t, r.c, r.i)
	r.want = &phasegatev1.EgressPolicy{Allow: []string{"1.1.1.1/32", "192.0.2.0/24"}, Deny: []string{"203.0.113.0/24"}}
	if !proto.Equal(sl.GetEgressPolicy(), r.want) {
		t.Errorf("Get shows policy %v, want %v", sl.GetEgressPolicy(), r.want)
	}
	if sl.GetGuestInterface() != "tap0" || sl.GetGuestAddress() != "169.254.255.21/30" || sl.GetGuestGateway() != "169.254.255.22" {
		t.Errorf("Get shows guest %q %q %q", sl.GetGuestInterface(), sl.GetGuestAddress(), sl.GetGuestGateway())
	}
	r.path = sl.GetNetnsPath()
	r.rules, r.tap = insideRules(t, r.path), tapIndex(t, r.path)
	for _, w := range []string{"table inet phasegate_egress", "table ip phasegate_guest", "1.1.1.1", "203.0.113.0/24", "dnat to 169.254.255.21"} {
		if !strings.Contains(r.rules, w) {
			t.Errorf("the slot's rules lack %q:\n%s", w, r.rules)
		}
	}
}

// restart stops the daemon as stop does (which starts the next one and
// returns how many verified lines the log had before) and checks the
// restored lease's slot was verified, not rewritten: the very same rules,
// the same tap, the policy and owner in Get.
func (r *microVMRig) restart(t *testing.T, name string, stop func() (base int)) {
	t.Helper()
	base := stop()
	r.d.waitServing(time.Minute)
	r.c = r.d.slots()
	waitFor(t, time.Minute, "the restored lease to be verified", func() bool {
		return strings.Count(r.d.Output(), insideVerifiedMarker) > base
	})
	if strings.Contains(r.d.Output(), "inside of its slot repaired") {
		t.Errorf("after %s the daemon rewrote a slot it found intact:\n%s", name, grepLines(r.d.Output(), "repaired"))
	}
	if got := insideRules(t, r.path); got != r.rules {
		t.Errorf("after %s the slot's rules changed:\nbefore:\n%s\nafter:\n%s", name, r.rules, got)
	}
	if got := tapIndex(t, r.path); got != r.tap {
		t.Errorf("after %s the tap is another (index %s, was %s)", name, got, r.tap)
	}
	got := getSlot(t, r.c, r.i)
	if !proto.Equal(got.GetEgressPolicy(), r.want) || got.GetOwner() != "vm-1" {
		t.Errorf("after %s Get shows %v", name, got)
	}
}

// repairMissingTables deletes the slot's tables while no daemon runs and
// checks the next start puts back what is missing, and only that: the
// tap (a running VM's) stays, the tables come back.
func (r *microVMRig) repairMissingTables(t *testing.T) {
	t.Helper()
	r.d.signal(syscall.SIGKILL)
	r.d.wait(30 * time.Second)
	for _, tbl := range []string{"ip phasegate_guest", "inet phasegate_egress"} {
		if out, err := exec.Command("nsenter", "--net="+r.path, "nft", "delete", "table", tbl).CombinedOutput(); err != nil {
			t.Fatalf("delete %s: %v\n%s", tbl, err, out)
		}
	}
	r.d = start(t, nil, r.args...)
	r.d.waitServing(time.Minute)
	r.c = r.d.slots()
	waitFor(t, time.Minute, "the restored lease to be repaired", func() bool {
		return strings.Contains(r.d.Output(), insideVerifiedMarker)
	})
	if l := grepLines(r.d.Output(), "inside of its slot repaired"); !strings.Contains(l, "guest NAT") || !strings.Contains(l, "egress policy inside (missing)") {
		t.Errorf("the repair does not say it put back the NAT and the policy:\n%s", l)
	}
	repaired := insideRules(t, r.path)
	for _, w := range []string{"table inet phasegate_egress", "table ip phasegate_guest", "1.1.1.1", "dnat to 169.254.255.21"} {
		if !strings.Contains(repaired, w) {
			t.Errorf("after the repair the slot's rules lack %q:\n%s", w, repaired)
		}
	}
	if got := tapIndex(t, r.path); got != r.tap {
		t.Errorf("the repair replaced the tap (index %s, was %s)", got, r.tap)
	}
	r.rules = repaired
}

// denyAllRecorded changes the lease's policy to deny all and checks the
// change takes effect in the rules and, once the daemon stops, in the
// record.
func (r *microVMRig) denyAllRecorded(t *testing.T, ctx context.Context) {
	t.Helper()
	set, err := r.c.SetEgressPolicy(ctx, &phasegatev1.SetEgressPolicyRequest{Index: r.i, LeaseId: r.leaseID, EgressPolicy: &phasegatev1.EgressPolicy{DenyAll: true}})
	if err != nil {
		t.Fatal(err)
	}
	if !set.GetSlot().GetEgressPolicy().GetDenyAll() {
		t.Errorf("SetEgressPolicy answered %v", set.GetSlot())
	}
	if got := insideRules(t, r.path); got == r.rules || strings.Contains(got, "1.1.1.1") {
		t.Errorf("rules after the change still the old ones:\n%s", got)
	}

	r.d.signal(syscall.SIGTERM)
	if code := r.d.wait(time.Minute); code != 0 {
		t.Fatalf("exit %d", code)
	}
	var rec leases.Record
	for _, lr := range r.h.assertOnlyRecorded(r.h.prefix) {
		if lr.Index == int(r.i) {
			rec = lr
		}
	}
	if rec.Egress == nil || !rec.Egress.DenyAll || len(rec.Egress.Allow) != 0 {
		t.Errorf("record of slot %d: %+v", r.i, rec.Egress)
	}
}

// A guest network the host routes is refused at start, exit 2, naming the
// route; nothing is made.
func TestGuestRangeTheHostRoutesIsRefused(t *testing.T) {
	h := newHost(t)
	// A blackhole route of the test's own, in the guest range.
	if out, err := exec.Command("ip", "route", "add", "blackhole", "169.254.255.20/31").CombinedOutput(); err != nil {
		t.Fatalf("ip route add: %v\n%s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "route", "del", "blackhole", "169.254.255.20/31").Run() })
	d := start(t, nil, h.args(freePort(t), append([]string{"--slots=16"}, e2eGuest...)...)...)
	if code := d.wait(time.Minute); code != 2 {
		t.Errorf("exit %d, want 2", code)
	}
	if !strings.Contains(d.Output(), "guest network 169.254.255.20/30 (--slot-guest-addr) overlaps what the host already uses: route 169.254.255.20/31") {
		t.Errorf("the refusal does not name the route:\n%s", grepLines(d.Output(), "guest"))
	}
	h.assertClean(h.prefix, nil)
}

// Bad microVM flags exit 2, saying what is wrong, before anything is made.
func TestBadMicroVMFlagsExitTwo(t *testing.T) {
	h := newHost(t)
	for _, tc := range []struct {
		flags []string
		want  string
	}{
		{[]string{"--slot-guest-tap=tap0"}, "--slot-guest-addr"},
		{[]string{"--slot-guest-tap=tap0", "--slot-guest-addr=169.254.255.21/30", "--slot-guest-gateway=169.254.255.29"}, "is not a host address of the guest network"},
		{append([]string{"--slot-cidr=169.254.255.0/24"}, e2eGuest...), "overlaps the guest range 169.254.255.20/30"},
		{[]string{"--slot-egress-proxy-port=3128"}, "--slot-egress-proxy-port 3128 is not in --slot-host-tcp-ports"},
		{[]string{"--slot-egress-allow=fd00::/8"}, "not an IPv4 CIDR"}, // IPv6 is always-denied alone (with --slot-cidr6)
		{append([]string{"--slot-guest-mac=01:00:5e:00:00:01"}, e2eGuest...), "want a unicast Ethernet MAC"},
		{append([]string{"--slot-guest-mac=02:fc"}, e2eGuest...), "not an Ethernet MAC"},
		{[]string{"--slot-guest-mac=02:fc:00:00:00:01"}, "--slot-guest-tap is required"},
	} {
		d := start(t, nil, h.args(freePort(t), append([]string{"--slots=16"}, tc.flags...)...)...)
		if code := d.wait(time.Minute); code != 2 || !strings.Contains(d.Output(), tc.want) {
			t.Errorf("%v: exit %d, want 2 saying %q:\n%s", tc.flags, code, tc.want, d.Output())
		}
	}
	h.assertClean(h.prefix, nil)
}
