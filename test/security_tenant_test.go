package test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
	"github.com/phasegate/phasegate/internal/iperf"
	"github.com/phasegate/phasegate/network/leases"
	"github.com/phasegate/phasegate/network/nft"
	"github.com/phasegate/phasegate/network/ports"
	"github.com/phasegate/phasegate/test/internal/microvm"
)

// A slot's tenant cannot lift what the host holds its lease to (issue 46,
// part 6, IPv4): its bandwidth limits, its published port, its counters
// and the anti-spoofing rules hold whatever root in its slot, or a process
// there holding CAP_NET_RAW alone, does inside; the victim, another slot,
// is untouched. The daemon runs in a namespace that plays the node, with
// an outside network behind it ("another host"), so that every packet
// stays in the test's namespaces.

// What the tenant's lease holds, in the node's namespace.
const (
	tenantHostPort = 18480      // published to the tenant's workload (workloadPort)
	tenantRate     = 20_000_000 // bit/s each way: modest, so that a loaded 2-core machine reaches it
	floodPackets   = 20_000     // per flood: scaled down from a real one, sent as fast as the tenant can
)

// loopbackAt is where a listener of the node waits for what a slot sends
// to 127.0.0.1.
var loopbackAt = netip.MustParseAddrPort("127.0.0.1:7600")

// tenantRig is the node, its outside, the daemon, the tenant's lease (a
// published port, limits both ways, counters) and the victim's, with a
// workload each.
type tenantRig struct {
	n        *node
	h        *host
	d        *daemon
	o        *outside
	pub      *publicDir
	tenant   *phasegatev1.Slot // as Acquire answered it
	victim   *phasegatev1.Slot
	victimAt netip.AddrPort
	victimIn *victimListener
	loopback *victimListener // the node's listener at loopbackAt
	flooded  uint64          // the flooded packets the host dropped (its ifb's tbf, antispoof)
}

func TestTenantCannotLiftItsLimitsMappingsNorCounters(t *testing.T) {
	r := newTenantRig(t)
	c := r.d.slots()
	published := netip.AddrPortFrom(nodeUplink.Addr(), tenantHostPort)
	if !echoesFrom(t, r.o.ns, published) {
		t.Fatal("before the attacks, the published port does not answer from another host: the test cannot tell a lifted mapping from a broken path")
	}
	limitsHold(t, r.n, r.tenant, "before the attacks")
	attack(t, r.pub.testBinary, r.tenant.GetNetnsPath(), fmt.Sprintf("udp|%s|%s|own|5", addrOf(t, r.tenant.GetInsideAddress(), 7300), r.o.reflector), "")
	if !waitSeen(r.o, "own") {
		t.Fatal("the tenant's datagram from its own address never reached the other host: the test cannot tell a drop from a broken path")
	}
	if !answers(t, r.n, r.victimAt) {
		t.Fatal("before the attacks, the victim's workload does not answer")
	}
	mac := neighbourOf(t, r.n, r.victim)
	before := observeVictimIn(t, r.n, c, r.victim.GetIndex())
	u0 := getSlot(t, c, r.tenant.GetIndex()).GetUsage()

	for _, caps := range []string{"", "net_raw"} {
		r.rawAttacks(t, caps)
	}
	// After the floods: with the victim's address its own, the slot would
	// deliver a flood at the victim to itself.
	r.rootReshapesItsSlot(t)

	// What the host holds the tenant to, as it was.
	limitsHold(t, r.n, r.tenant, "after the attacks")
	if !echoesFrom(t, r.o.ns, published) {
		t.Error("after the attacks, the published port no longer answers from another host")
	}
	got := getSlot(t, c, r.tenant.GetIndex())
	if !proto.Equal(&phasegatev1.Slot{Ports: got.GetPorts(), Bandwidth: got.GetBandwidth()},
		&phasegatev1.Slot{Ports: r.tenant.GetPorts(), Bandwidth: r.tenant.GetBandwidth()}) {
		t.Errorf("after the attacks the lease shows ports %v, limits %v; it was given %v, %v",
			got.GetPorts(), got.GetBandwidth(), r.tenant.GetPorts(), r.tenant.GetBandwidth())
	}
	// The counters never went back, and the floods are the tenant's: every
	// flooded packet the host dropped is counted out of its slot (its host
	// end's receive, before any rule), spoofed or not.
	u1 := got.GetUsage()
	notBelow(t, "after the attacks, the tenant's", u1, u0)
	if u1.GetPacketsOut() < u0.GetPacketsOut()+r.flooded {
		t.Errorf("the tenant's packets out went from %d to %d, below the %d flooded packets the host dropped", u0.GetPacketsOut(), u1.GetPacketsOut(), r.flooded)
	}
	t.Logf("the tenant's usage: %v before the attacks, %v after", u0, u1)

	// The victim: the same lease, namespace and host link, its usage not
	// billed the floods, its workload answering, its neighbour entry as it
	// was, and nothing of the attacks delivered to it.
	after := observeVictimIn(t, r.n, c, r.victim.GetIndex())
	before.same(t, after, "the tenant's attacks")
	if after.usage.GetPacketsIn() >= before.usage.GetPacketsIn()+r.flooded/8 {
		t.Errorf("the victim's packets in went from %d to %d: the floods were billed to it", before.usage.GetPacketsIn(), after.usage.GetPacketsIn())
	}
	if !answers(t, r.n, r.victimAt) {
		t.Error("after the attacks, the victim's workload no longer answers")
	}
	if m := neighbourOf(t, r.n, r.victim); m != mac {
		t.Errorf("the node's neighbour entry for the victim went from %s to %s", mac, m)
	}
	if got := r.victimIn.received(); len(got) > 0 {
		t.Errorf("the victim's workload received %d datagrams of the attacks, the first %q", len(got), got[0])
	}

	r.hostRootDeletesWhatTheLeaseHolds(t, published)
	r.loopbackDroppedByItsRule(t) // last: it takes a rule out of the daemon's table
}

func newTenantRig(t *testing.T) *tenantRig {
	t.Helper()
	r := &tenantRig{n: newNode(t)}
	r.o = newOutside(t, r.n)
	r.pub = newPublicDir(t)
	var slots map[string]*phasegatev1.Slot
	r.h, r.d, slots = slotsInNode(t, r.n, []string{"--reconcile-interval=2s"}, []string{"victim"}, nil)
	r.victim = slots["victim"]
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	slotPort, _ := strconv.Atoi(workloadPort)
	resp, err := r.d.slots().Acquire(ctx, &phasegatev1.AcquireRequest{Owner: "tenant", RequestId: "tenant",
		Ports:     []*phasegatev1.PublishedPort{{HostPort: tenantHostPort, SlotPort: uint32(slotPort)}},
		Bandwidth: &phasegatev1.Bandwidth{IngressRate: tenantRate, EgressRate: tenantRate}})
	if err != nil {
		t.Fatal(err)
	}
	r.tenant = resp.GetSlot()
	inside, _, _ := strings.Cut(r.tenant.GetInsideAddress(), "/")
	// The workload's prober runs here, outside the node, and reaches
	// nothing: the test dials it from the other host instead.
	startWorkload(t, r.tenant.GetIndex(), r.tenant.GetNetnsPath(), inside).finish()
	r.victimAt = addrOf(t, r.victim.GetInsideAddress(), 7200)
	r.victimIn = listenIn(t, r.victim.GetNetnsPath(), r.victimAt)
	r.loopback = listenIn(t, r.n.ns, loopbackAt)
	return r
}

// rootReshapesItsSlot is root in the tenant's slot: its own qdiscs
// replaced by permissive ones, its tables flushed, a jumbo MTU, the
// victim's address taken and claimed to the host by ARP. Each command
// must succeed (the kernel lets the slot's root do all of it), but for
// the first, as eth0 has no root qdisc of its own to delete.
func (r *tenantRig) rootReshapesItsSlot(t *testing.T) {
	t.Helper()
	victim, _, _ := strings.Cut(r.victim.GetInsideAddress(), "/")
	for k, c := range [][]string{
		{"tc", "qdisc", "del", "dev", "eth0", "root"},
		{"tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", "10gbit", "burst", "10m", "latency", "50ms"},
		{"tc", "qdisc", "replace", "dev", "eth0", "root", "pfifo"},
		{"tc", "qdisc", "add", "dev", "eth0", "clsact"},
		{"nft", "flush", "ruleset"},
		{"ip", "link", "set", "eth0", "mtu", "9000"},
		{"ip", "addr", "add", victim + "/32", "dev", "eth0"},
	} {
		out, err := exec.Command("nsenter", append([]string{"--net=" + r.tenant.GetNetnsPath(), "--"}, c...)...).CombinedOutput()
		if err != nil && k > 0 {
			t.Fatalf("root in the tenant's slot, %v: %v: %s", c, err, out)
		}
	}
	gateway := addrOf(t, r.tenant.GetHostAddress(), 0)
	attack(t, r.pub.testBinary, r.tenant.GetNetnsPath(), fmt.Sprintf("arp|%s:0|%s|-|5", victim, gateway), "")
}

// rawAttacks sends what a raw socket can from the tenant's slot, as root
// there (caps "") or as nobody holding caps alone: floods with spoofed
// sources, to the other host and to the victim, and datagrams to the
// node's 127.0.0.1 past the slot's own routes. Each is dropped on the
// host, counted there, and reaches no one.
func (r *tenantRig) rawAttacks(t *testing.T, caps string) {
	t.Helper()
	who := "root in the slot"
	if caps != "" {
		who = "CAP_NET_RAW alone"
	}
	own := addrOf(t, r.tenant.GetInsideAddress(), 7300)
	var srcs []string
	for _, a := range []netip.AddrPort{r.victimAt, addrOf(t, r.victim.GetHostAddress(), 7300),
		netip.AddrPortFrom(r.n.ip, 7300), r.o.reflector, netip.MustParseAddrPort("203.0.113.7:7300")} {
		srcs = append(srcs, a.String())
	}
	ifb := strings.Replace(r.tenant.GetHostInterface(), r.h.prefix+"h", r.h.prefix+"b", 1)
	out0 := getSlot(t, r.d.slots(), r.tenant.GetIndex()).GetUsage().GetPacketsOut()
	spoofed0, shaped0 := counter(t, r.n, r.h.prefix, "spoofed"), qdiscDrops(t, r.n, ifb)
	began := time.Now()
	for _, to := range []netip.AddrPort{r.o.reflector, r.victimAt} {
		attack(t, r.pub.testBinary, r.tenant.GetNetnsPath(), fmt.Sprintf("flood|%s|%s|flood by %s|%d", strings.Join(srcs, ","), to, who, floodPackets), caps)
	}
	took := time.Since(began)
	// What left the slot (its host end received it: the tenant's packets
	// out; the slot's own veth drops what its peer's backlog cannot take)
	// and exceeded its limit was dropped by the tbf of its ifb before the
	// table saw it; the table dropped the rest as spoofed. None got
	// further.
	var sent, spoofed, shaped uint64
	if !poll(10*time.Second, func() bool {
		sent = getSlot(t, r.d.slots(), r.tenant.GetIndex()).GetUsage().GetPacketsOut() - out0
		spoofed, shaped = counter(t, r.n, r.h.prefix, "spoofed")-spoofed0, qdiscDrops(t, r.n, ifb)-shaped0
		return sent > 0 && spoofed+shaped >= sent
	}) {
		t.Errorf("%s: of 2 floods of %d packets, %d left the slot: %d dropped by the limit's tbf and %d as spoofed", who, floodPackets, sent, shaped, spoofed)
	}
	r.flooded += spoofed + shaped
	t.Logf("%s: 2 floods of %d packets in %v: %d left the slot (its packets out), %d dropped by the limit's tbf, %d as spoofed",
		who, floodPackets, took.Round(time.Millisecond), sent, shaped, spoofed)
	time.Sleep(300 * time.Millisecond) // what the reflector would have answered by now
	if r.o.saw("flood by " + who) {
		t.Errorf("%s: a flooded datagram with a spoofed source reached the other host", who)
	}

	loop0 := counter(t, r.n, r.h.prefix, "to-loopback")
	attack(t, r.pub.testBinary, r.tenant.GetNetnsPath(), fmt.Sprintf("eth|%s|%s|loopback by %s|5|%s", own, loopbackAt, who, r.gatewayMAC(t)), caps)
	waitFor(t, 10*time.Second, "the datagrams to 127.0.0.1 counted", func() bool {
		return counter(t, r.n, r.h.prefix, "to-loopback") >= loop0+5
	})
	if got := r.loopback.received(); len(got) > 0 {
		t.Errorf("%s: the node's 127.0.0.1 received %q from the slot", who, got)
	}
}

// hostRootDeletesWhatTheLeaseHolds is root on the host (the node): the
// tenant's mapping deleted from the map (nft delete element) is put back
// by the next reconcile pass, and its ifb deleted is put back by Get,
// which says so.
func (r *tenantRig) hostRootDeletesWhatTheLeaseHolds(t *testing.T, published netip.AddrPort) {
	t.Helper()
	table := nft.TableName(r.h.prefix)
	inNode := func(args ...string) string {
		return run(t, "nsenter", append([]string{"--net=" + r.n.ns, "--"}, args...)...)
	}
	element := fmt.Sprintf("tcp . %d", tenantHostPort)
	inNode("nft", "delete", "element", "inet", table, ports.MapAny, "{ "+element+" }")
	waitFor(t, 20*time.Second, "the deleted mapping put back by a reconcile pass", func() bool {
		return strings.Contains(inNode("nft", "list", "map", "inet", table, ports.MapAny), element)
	})
	if !echoesFrom(t, r.o.ns, published) {
		t.Error("the mapping put back does not answer from another host")
	}

	ifb := strings.Replace(r.tenant.GetHostInterface(), r.h.prefix+"h", r.h.prefix+"b", 1)
	inNode("ip", "link", "del", ifb)
	got := getSlot(t, r.d.slots(), r.tenant.GetIndex())
	if !strings.Contains(strings.Join(got.GetRepaired(), ","), "bandwidth limits") {
		t.Errorf("Get after the ifb was deleted: repaired %q", got.GetRepaired())
	}
	if q := inNode("tc", "qdisc", "show", "dev", ifb, "root"); !strings.Contains(q, "tbf") {
		t.Errorf("after Get, %s's root: %s", ifb, q)
	}
}

// loopbackDroppedByItsRule shows it is the table's to-loopback rule that
// drops a slot's datagram to 127.0.0.1 (the host end of a slot with a
// published port routes 127/8): without it, the same datagram reaches the
// host's input and is counted there instead. It leaves the table without
// the rule: the test's last step.
func (r *tenantRig) loopbackDroppedByItsRule(t *testing.T) {
	t.Helper()
	table := nft.TableName(r.h.prefix)
	out := run(t, "nsenter", "--net="+r.n.ns, "--", "nft", "-a", "list", "chain", "inet", table, nft.ChainSpoof)
	m := regexp.MustCompile(`comment "to-loopback" # handle (\d+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no to-loopback rule in chain %s:\n%s", nft.ChainSpoof, out)
	}
	run(t, "nsenter", "--net="+r.n.ns, "--", "nft", "delete", "rule", "inet", table, nft.ChainSpoof, "handle", m[1])
	host0 := counter(t, r.n, r.h.prefix, "to-host")
	own := addrOf(t, r.tenant.GetInsideAddress(), 7300)
	attack(t, r.pub.testBinary, r.tenant.GetNetnsPath(), fmt.Sprintf("eth|%s|%s|without the rule|5|%s", own, loopbackAt, r.gatewayMAC(t)), "")
	waitFor(t, 10*time.Second, "the datagrams to 127.0.0.1 at the host's input, once the to-loopback rule is gone", func() bool {
		return counter(t, r.n, r.h.prefix, "to-host") >= host0+5
	})
}

// gatewayMAC is the MAC address of the tenant's host end, where the
// slot's frames go.
func (r *tenantRig) gatewayMAC(t *testing.T) string {
	t.Helper()
	var ifc *net.Interface
	if err := r.n.inNamespace(func() (err error) {
		ifc, err = net.InterfaceByName(r.tenant.GetHostInterface())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return ifc.HardwareAddr.String()
}

// limitsHold measures TCP each way between the node and slot s with
// iperf3 and fails unless each is at most 5% above tenantRate on the wire
// and at least 80% of it (the slot still carries traffic). A run that
// falls short is measured once more: on a shared 2-core machine a run
// starved of CPU falls short of any limit, while one above it is the limit
// lifted, never retried.
func limitsHold(t *testing.T, n *node, s *phasegatev1.Slot, when string) {
	t.Helper()
	at := addrOf(t, s.GetInsideAddress(), 0).Addr()
	for _, out := range []bool{false, true} {
		way := map[bool]string{false: "into the slot", true: "out of the slot"}[out]
		got := iperf.Throughput(t, n.ns, s.GetNetnsPath(), at, 3*time.Second, out)
		if got < 0.95*tenantRate {
			got = iperf.Throughput(t, n.ns, s.GetNetnsPath(), at, 3*time.Second, out)
		}
		t.Logf("%s, %s: %.2f Mbit/s on the wire, limit %d", when, way, got/1e6, tenantRate/1_000_000)
		if got > 1.05*tenantRate || got < 0.8*tenantRate {
			t.Errorf("%s, %s: %.2f Mbit/s on the wire, want %d Mbit/s (+5%%, -20%%)", when, way, got/1e6, tenantRate/1_000_000)
		}
	}
}

// echoesFrom reports whether a line echo answers at at, dialled from the
// namespace bound at ns, within 5 s.
func echoesFrom(t *testing.T, ns string, at netip.AddrPort) bool {
	t.Helper()
	return poll(5*time.Second, func() bool {
		var c net.Conn
		if err := microvm.InNamespace(ns, func() (err error) {
			c, err = net.DialTimeout("tcp", at.String(), time.Second)
			return err
		}); err != nil {
			return false
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := c.Write([]byte("from another host\n")); err != nil {
			return false
		}
		line, err := bufio.NewReader(c).ReadString('\n')
		return err == nil && line == "from another host\n"
	})
}

// neighbourOf is the MAC address the node's neighbour table holds for
// slot s's inside address on its host end.
func neighbourOf(t *testing.T, n *node, s *phasegatev1.Slot) string {
	t.Helper()
	inside, _, _ := strings.Cut(s.GetInsideAddress(), "/")
	out := run(t, "nsenter", "--net="+n.ns, "--", "ip", "-4", "neigh", "show", inside, "dev", s.GetHostInterface())
	f := strings.Fields(out)
	for k := range f[:max(len(f)-1, 0)] {
		if f[k] == "lladdr" {
			return f[k+1]
		}
	}
	t.Fatalf("the node has no neighbour entry for %s on %s: %q", inside, s.GetHostInterface(), out)
	return ""
}

// qdiscDrops is how many packets the root qdisc of dev in the node has
// dropped.
func qdiscDrops(t *testing.T, n *node, dev string) uint64 {
	t.Helper()
	out := run(t, "nsenter", "--net="+n.ns, "--", "tc", "-s", "qdisc", "show", "dev", dev, "root")
	m := regexp.MustCompile(`dropped (\d+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no drop count in tc's statistics of %s:\n%s", dev, out)
	}
	v, _ := strconv.ParseUint(m[1], 10, 64)
	return v
}

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

	victims := victimLeases(t, root, pub, S, rootPort, otherPort)
	type kept struct {
		state  victimState
		qdiscs string
	}
	var before []kept
	for _, vi := range victims {
		st := observeVictim(t, root, vi.idx)
		before = append(before, kept{st, qdiscsOf(h, st.slot.GetHostInterface())})
	}
	elements := mapElements(t, h)

	attackAnothersLeases(t, pub, S, victims, ownPort)
	tenantTakesNoOnesPort(t, pub, S, rootPort, otherPort, ownPort)
	tenantWithinItsPortQuota(t, pub, S, hp)
	listShowsNoOneElses(t, pub, S)

	for k, vi := range victims {
		b := before[k]
		b.state.same(t, observeVictim(t, root, vi.idx), "the tenants' calls")
		if q := qdiscsOf(h, b.state.slot.GetHostInterface()); q != b.qdiscs {
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

// anotherLease is a lease a tenant attacks: its slot and its lease id.
type anotherLease struct {
	idx     uint32
	leaseID string
}

// victimLeases are root's lease publishing rootPort with limits both
// ways, and daemon's publishing otherPort with a limit into its slot
// (through the command line, as uid 1 in nogroup).
func victimLeases(t *testing.T, root phasegatev1.SlotsClient, pub *publicDir, S, rootPort, otherPort string) []anotherLease {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
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
	return []anotherLease{{v.GetSlot().GetIndex(), v.GetLeaseId()}, {uint32(other.Slot.Index), other.LeaseID}}
}

// attackAnothersLeases has nobody publish, withdraw, lift and clear on
// each victim lease, with its lease id and a guessed one, and read its
// counters; daemon withdraw root's ports: PermissionDenied each time.
func attackAnothersLeases(t *testing.T, pub *publicDir, S string, victims []anotherLease, ownPort string) {
	t.Helper()
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
}

// listShowsNoOneElses checks each tenant's List leaves out the leases
// (and so the counters) of owners it may not see.
func listShowsNoOneElses(t *testing.T, pub *publicDir, S string) {
	t.Helper()
	for _, user := range []string{"nobody", "daemon"} {
		out, code := pub.as(t, user, map[string]string{"daemon": "nogroup"}[user], "slots", "list", "--all", S)
		for _, name := range map[string][]string{"nobody": {"victim", "tenant-c-1"}, "daemon": {"victim", "tenant-b-"}}[user] {
			if code != 0 || strings.Contains(out, name) {
				t.Errorf("list as %s: exit %d, shows %s's lease (and its counters):\n%s", user, code, name, out)
			}
		}
	}
}

// qdiscsOf is h.qdiscs of dev, read again for up to 10 s while tc says
// its dump was interrupted (links of the host's other tests come and go
// meanwhile, and then what it lists may be short).
func qdiscsOf(h *host, dev string) string {
	var q string
	poll(10*time.Second, func() bool {
		q = h.qdiscs(dev)
		return !strings.Contains(q, "Dump was interrupted")
	})
	return q
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
