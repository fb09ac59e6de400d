package test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
	"github.com/phasegate/phasegate/network/leases"
	"github.com/phasegate/phasegate/network/nft"
	"github.com/phasegate/phasegate/network/ports"
)

// Another's published ports, limits and counters, over the control
// socket (issue 46, part 6): nobody (uid 65534, which the policy lets
// lease tenant-b-*) and daemon (uid 1, tenant-c-*) are tenants of one
// node; root holds the victim's lease. Neither tenant may change the
// ports or the limits of a lease not its own, with its lease id or a
// guessed one, nor publish a host port another lease holds (on every
// address or on one), nor see another's counters (Get refused, List
// leaving the lease out), nor publish more host ports than its quota
// (max_ports in the control policy). The victims' leases, map elements
// and qdiscs are unchanged, every refusal is audited, and the tenant's
// own lease takes what it asks (the positive control).
func TestTenantCannotTouchAnothersPortsLimitsNorCounters(t *testing.T) {
	pub := newPublicDir(t)
	h := newHost(t)
	sock := filepath.Join(pub.dir, "control.sock")
	policy := filepath.Join(pub.dir, "policy.json")
	writePolicyFile(t, policy, `{"max_ports": 3, "principals": [{"uid": 65534, "owners": ["tenant-b-*"]}, {"uid": 1, "owners": ["tenant-c-*"]}]}`)
	d := start(t, nil, h.args(freePort(t), "--slots=16", "--control-socket="+sock, "--control-group=nogroup", "--control-policy="+policy)...)
	d.waitServing(time.Minute)
	root := d.slots()
	S := "--socket=" + sock
	hp := func() string { _, p, _ := net.SplitHostPort(freePort(t)); return p }
	rootPort, otherPort, ownPort := hp(), hp(), hp()

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	p, _ := strconv.Atoi(rootPort)
	v, err := root.Acquire(ctx, &phasegatev1.AcquireRequest{Owner: "victim", RequestId: "victim",
		Ports:     []*phasegatev1.PublishedPort{{HostPort: uint32(p), SlotPort: 80}},
		Bandwidth: &phasegatev1.Bandwidth{IngressRate: 40e6, EgressRate: 20e6}})
	if err != nil {
		t.Fatal(err)
	}
	out, code := pub.as(t, "daemon", "nogroup", "slots", "acquire", "tenant-c-1", "--publish", otherPort+":80", "--ingress-rate=30000000", S)
	var other leaseOut
	if code != 0 || json.Unmarshal([]byte(out), &other) != nil || other.LeaseID == "" {
		t.Fatalf("daemon's own acquire: exit %d\n%s", code, out)
	}
	victims := []struct {
		idx     uint32
		leaseID string
	}{{v.GetSlot().GetIndex(), v.GetLeaseId()}, {uint32(other.Slot.Index), other.LeaseID}}
	type kept struct {
		state  victimState
		qdiscs string
	}
	var before []kept
	for _, vi := range victims {
		st := observeVictim(t, root, vi.idx)
		before = append(before, kept{st, h.qdiscs(st.slot.GetHostInterface())})
	}
	elements := mapElements(t, h)

	for k, vi := range victims {
		idx := fmt.Sprint(vi.idx)
		for _, tc := range []struct {
			what, user, group string
			args              []string
		}{
			{"publish a port with its lease id", "nobody", "", []string{"ports", idx, vi.leaseID, "--publish", ownPort + ":22"}},
			{"withdraw its ports with its lease id", "nobody", "", []string{"ports", idx, vi.leaseID}},
			{"publish a port with a guessed lease id", "nobody", "", []string{"ports", idx, leases.NewLeaseID(), "--publish", ownPort + ":22"}},
			{"lift its limits with its lease id", "nobody", "", []string{"bandwidth", idx, vi.leaseID, "--ingress-rate=32000000000", "--egress-rate=32000000000"}},
			{"clear its limits with its lease id", "nobody", "", []string{"bandwidth", idx, vi.leaseID}},
			{"see its counters", "nobody", "", []string{"get", idx}},
			{"withdraw root's ports as another tenant", "daemon", "nogroup", []string{"ports", idx, vi.leaseID}},
		} {
			if k == 1 && tc.user == "daemon" {
				continue // its own lease
			}
			out, code := pub.as(t, tc.user, tc.group, append(append([]string{"slots"}, tc.args...), S)...)
			wantRefused(t, fmt.Sprintf("as %s, slot %s: %s", tc.user, idx, tc.what), out, code, "PermissionDenied")
		}
	}
	tenantTakesNoOnesPort(t, pub, S, rootPort, otherPort, ownPort)
	tenantWithinItsPortQuota(t, pub, S, hp)
	for _, user := range []string{"nobody", "daemon"} {
		out, code := pub.as(t, user, map[string]string{"daemon": "nogroup"}[user], "slots", "list", "--all", S)
		for _, name := range map[string][]string{"nobody": {"victim", "tenant-c-1"}, "daemon": {"victim", "tenant-b-"}}[user] {
			if code != 0 || strings.Contains(out, name) {
				t.Errorf("list as %s: exit %d, shows %s's lease (and its counters):\n%s", user, code, name, out)
			}
		}
	}

	for k, vi := range victims {
		b := before[k]
		b.state.same(t, observeVictim(t, root, vi.idx), "the tenants' calls")
		if q := h.qdiscs(b.state.slot.GetHostInterface()); q != b.qdiscs {
			t.Errorf("slot %d's qdiscs changed:\nbefore %s\nafter  %s", vi.idx, b.qdiscs, q)
		}
	}
	if got := mapElements(t, h); len(elements) != 2 || !slices.Contains(got, elements[0]) || !slices.Contains(got, elements[1]) {
		t.Errorf("the published ports' elements changed:\nbefore %q\nafter  %q", elements, got)
	}
	d.signal(syscall.SIGTERM)
	if code := d.wait(time.Minute); code != 0 {
		t.Fatalf("stop: exit %d", code)
	}
	for _, m := range []string{"SetPorts", "SetBandwidth", "Get"} {
		if !strings.Contains(d.Output(), `msg="control call refused" audit=true method=`+m+` surface=socket principal=uid:65534`) {
			t.Errorf("no audit line of nobody's refused %s:\n%s", m, grepLines(d.Output(), "method="+m))
		}
	}
	h.decommission(h.prefix)
}

// tenantTakesNoOnesPort has nobody ask for the host ports root's and
// daemon's leases publish (at Acquire, and by SetPorts on a lease of its
// own), on every address and on 127.0.0.1: AlreadyExists each time. Its
// own lease publishes a free port and sets its own limits.
func tenantTakesNoOnesPort(t *testing.T, pub *publicDir, S, rootPort, otherPort, ownPort string) {
	t.Helper()
	for k, taken := range []string{rootPort + ":80", "127.0.0.1:" + otherPort + ":81"} {
		out, code := pub.as(t, "nobody", "", "slots", "acquire", fmt.Sprintf("tenant-b-taken-%d", k), "--publish", taken, S)
		wantRefused(t, "as nobody, acquire publishing "+taken, out, code, "AlreadyExists")
	}
	out, code := pub.as(t, "nobody", "", "slots", "acquire", "tenant-b-1", "--publish", ownPort+":80", S)
	var own leaseOut
	if code != 0 || json.Unmarshal([]byte(out), &own) != nil || len(own.Slot.Ports) != 1 {
		t.Fatalf("nobody's own acquire publishing %s: exit %d\n%s", ownPort, code, out)
	}
	idx := fmt.Sprint(own.Slot.Index)
	for _, taken := range []string{otherPort + ":80", rootPort + ":80/tcp"} {
		out, code := pub.as(t, "nobody", "", "slots", "ports", idx, own.LeaseID, "--publish", ownPort+":80", "--publish", taken, S)
		wantRefused(t, "as nobody, its own lease publishing "+taken, out, code, "AlreadyExists")
	}
	if out, code := pub.as(t, "nobody", "", "slots", "bandwidth", idx, own.LeaseID, "--egress-rate=10000000", S); code != 0 || !strings.Contains(out, "10000000") {
		t.Errorf("nobody's limits on its own lease: exit %d\n%s", code, out)
	}
}

// tenantWithinItsPortQuota has nobody, whose one lease publishes one
// host port, go past its quota of 3 (max_ports) with 3 more on a new
// lease: refused as ResourceExhausted, naming the quota. 2 more are
// taken.
func tenantWithinItsPortQuota(t *testing.T, pub *publicDir, S string, hp func() string) {
	t.Helper()
	publish := func(n int) []string {
		var args []string
		for range n {
			args = append(args, "--publish", hp()+":80")
		}
		return args
	}
	out, code := pub.as(t, "nobody", "", append([]string{"slots", "acquire", "tenant-b-2"}, append(publish(3), S)...)...)
	wantRefused(t, "as nobody, a lease taking it to 4 host ports of 3", out, code, "ResourceExhausted")
	if !strings.Contains(out, "max_ports") {
		t.Errorf("the refusal does not name the quota: %s", out)
	}
	out, code = pub.as(t, "nobody", "", append([]string{"slots", "acquire", "tenant-b-2"}, append(publish(2), S)...)...)
	if code != 0 {
		t.Errorf("as nobody, a lease taking it to 3 host ports of 3: exit %d\n%s", code, out)
	}
}

// mapElements is what the daemon's maps of published ports hold, one
// element each, as nft lists them.
func mapElements(t *testing.T, h *host) []string {
	t.Helper()
	var els []string
	for _, m := range []string{ports.MapAny, ports.MapAddr} {
		out := run(t, "nft", "list", "map", "inet", nft.TableName(h.prefix), m)
		if _, e, ok := strings.Cut(out, "elements = {"); ok {
			e, _, _ = strings.Cut(e, "}")
			for _, el := range strings.Split(e, ",") {
				els = append(els, strings.Join(strings.Fields(el), " "))
			}
		}
	}
	return els
}
