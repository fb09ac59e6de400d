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
	h := newHost(t)
	args := h.args(freePort(t), append([]string{"--slots=16"}, e2eGuest...)...)
	d := start(t, nil, args...)
	d.waitServing(time.Minute)
	c := d.slots()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	policy := &phasegatev1.EgressPolicy{Allow: []string{"1.1.1.1", "192.0.2.0/24"}, Deny: []string{"203.0.113.0/24"}}
	resp, err := c.Acquire(ctx, &phasegatev1.AcquireRequest{Owner: "vm-1", RequestId: "r1", EgressPolicy: policy})
	if err != nil {
		t.Fatal(err)
	}
	i := resp.GetSlot().GetIndex()
	sl := getSlot(t, c, i)
	want := &phasegatev1.EgressPolicy{Allow: []string{"1.1.1.1/32", "192.0.2.0/24"}, Deny: []string{"203.0.113.0/24"}}
	if !proto.Equal(sl.GetEgressPolicy(), want) {
		t.Errorf("Get shows policy %v, want %v", sl.GetEgressPolicy(), want)
	}
	if sl.GetGuestInterface() != "tap0" || sl.GetGuestAddress() != "169.254.255.21/30" || sl.GetGuestGateway() != "169.254.255.22" {
		t.Errorf("Get shows guest %q %q %q", sl.GetGuestInterface(), sl.GetGuestAddress(), sl.GetGuestGateway())
	}
	path := sl.GetNetnsPath()
	rules, tap := insideRules(t, path), tapIndex(t, path)
	for _, w := range []string{"table inet phasegate_egress", "table ip phasegate_guest", "1.1.1.1", "203.0.113.0/24", "dnat to 169.254.255.21"} {
		if !strings.Contains(rules, w) {
			t.Errorf("the slot's rules lack %q:\n%s", w, rules)
		}
	}

	const marker = "restored leases: inside of their slots verified"
	restart := func(name string, stop func() (base int)) {
		t.Helper()
		base := stop()
		d.waitServing(time.Minute)
		c = d.slots()
		waitFor(t, time.Minute, "the restored lease to be verified", func() bool {
			return strings.Count(d.Output(), marker) > base
		})
		if strings.Contains(d.Output(), "inside of its slot repaired") {
			t.Errorf("after %s the daemon rewrote a slot it found intact:\n%s", name, grepLines(d.Output(), "repaired"))
		}
		if got := insideRules(t, path); got != rules {
			t.Errorf("after %s the slot's rules changed:\nbefore:\n%s\nafter:\n%s", name, rules, got)
		}
		if got := tapIndex(t, path); got != tap {
			t.Errorf("after %s the tap is another (index %s, was %s)", name, got, tap)
		}
		got := getSlot(t, c, i)
		if !proto.Equal(got.GetEgressPolicy(), want) || got.GetOwner() != "vm-1" {
			t.Errorf("after %s Get shows %v", name, got)
		}
	}
	restart("kill -9", func() int {
		d.signal(syscall.SIGKILL)
		d.wait(30 * time.Second)
		d = start(t, nil, args...)
		return 0
	})
	restart("SIGTERM", func() int {
		d.signal(syscall.SIGTERM)
		if code := d.wait(time.Minute); code != 0 {
			t.Fatalf("exit %d", code)
		}
		d = start(t, nil, args...)
		return 0
	})
	restart("SIGHUP", func() int {
		base := strings.Count(d.Output(), marker)
		serving := strings.Count(d.Output(), "msg=serving ")
		d.signal(syscall.SIGHUP)
		waitFor(t, 2*time.Minute, "the upgraded daemon to serve", func() bool {
			return strings.Count(d.Output(), "msg=serving ") > serving
		})
		return base
	})

	// What is missing is put back, and only that: the tap (a running VM's)
	// stays, the tables come back.
	d.signal(syscall.SIGKILL)
	d.wait(30 * time.Second)
	for _, tbl := range []string{"ip phasegate_guest", "inet phasegate_egress"} {
		if out, err := exec.Command("nsenter", "--net="+path, "nft", "delete", "table", tbl).CombinedOutput(); err != nil {
			t.Fatalf("delete %s: %v\n%s", tbl, err, out)
		}
	}
	d = start(t, nil, args...)
	d.waitServing(time.Minute)
	c = d.slots()
	waitFor(t, time.Minute, "the restored lease to be repaired", func() bool {
		return strings.Contains(d.Output(), marker)
	})
	if l := grepLines(d.Output(), "inside of its slot repaired"); !strings.Contains(l, "guest NAT") || !strings.Contains(l, "egress policy inside (missing)") {
		t.Errorf("the repair does not say it put back the NAT and the policy:\n%s", l)
	}
	repaired := insideRules(t, path)
	for _, w := range []string{"table inet phasegate_egress", "table ip phasegate_guest", "1.1.1.1", "dnat to 169.254.255.21"} {
		if !strings.Contains(repaired, w) {
			t.Errorf("after the repair the slot's rules lack %q:\n%s", w, repaired)
		}
	}
	if got := tapIndex(t, path); got != tap {
		t.Errorf("the repair replaced the tap (index %s, was %s)", got, tap)
	}
	rules = repaired

	// A change takes effect, in the rules and the record.
	set, err := c.SetEgressPolicy(ctx, &phasegatev1.SetEgressPolicyRequest{Index: i, LeaseId: resp.GetLeaseId(), EgressPolicy: &phasegatev1.EgressPolicy{DenyAll: true}})
	if err != nil {
		t.Fatal(err)
	}
	if !set.GetSlot().GetEgressPolicy().GetDenyAll() {
		t.Errorf("SetEgressPolicy answered %v", set.GetSlot())
	}
	if got := insideRules(t, path); got == rules || strings.Contains(got, "1.1.1.1") {
		t.Errorf("rules after the change still the old ones:\n%s", got)
	}

	d.signal(syscall.SIGTERM)
	if code := d.wait(time.Minute); code != 0 {
		t.Fatalf("exit %d", code)
	}
	var rec leases.Record
	for _, r := range h.assertOnlyRecorded(h.prefix) {
		if r.Index == int(i) {
			rec = r
		}
	}
	if rec.Egress == nil || !rec.Egress.DenyAll || len(rec.Egress.Allow) != 0 {
		t.Errorf("record of slot %d: %+v", i, rec.Egress)
	}

	// Release: the slot, its tap and its tables go with the namespace.
	d = start(t, nil, args...)
	d.waitServing(time.Minute)
	c = d.slots()
	if _, err := c.Release(ctx, &phasegatev1.ReleaseRequest{Index: i, LeaseId: resp.GetLeaseId()}); err != nil {
		t.Fatal(err)
	}
	if got := getSlot(t, c, i); got.GetEgressPolicy() != nil || got.GetOwner() != "" {
		t.Errorf("after Release Get shows %v", got)
	}
	d.signal(syscall.SIGTERM)
	d.wait(time.Minute)
	h.stoppedCleanly(h.prefix, nil)
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
		{[]string{"--slot-egress-deny=fd00::/8"}, "not an IPv4 CIDR"},
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
