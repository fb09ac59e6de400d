package test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
	"github.com/phasegate/phasegate/network/leases"
	"github.com/phasegate/phasegate/test/internal/microvm"
)

// vmSlot is a leased slot with a guest running on its tap.
type vmSlot struct {
	slot  *phasegatev1.Slot
	lease string
	at    netip.AddrPort // the guest's echo server at the slot's own address
	vm    *microvm.VM
}

// TestVMInSlots runs real microVMs in two slots of a daemon that makes the
// guest device in each (the slot profile) and gives each lease an egress
// policy, and shows what a sandbox orchestrator relies on: the node
// reaches each guest at its slot's own address (through the slot's NAT);
// a guest reaches what its policy allows and not what it denies; a policy
// replacement takes effect at once and breaks no connection; a connection
// into a guest is never interrupted by kill -9, SIGTERM and a new start,
// or SIGHUP of the daemon; two guests cannot reach each other; and after
// the releases and a stop nothing of either is left.
//
// The daemon runs in a namespace that plays the node (newNode), so
// forwarding is turned on there and not on this shared machine; the far
// ends are namespaces of the test's own, joined to the node by veths, with
// blackhole routes for their ranges on the node.
func TestVMInSlots(t *testing.T) {
	r := newVMSlotsRig(t)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	a, b, farA, farB := r.bootGuests(t, ctx)

	// The guests' view: what the policy allows, not what it denies, and
	// not each other.
	waitRound(t, ctx, a.vm, 0, map[netip.AddrPort]string{farA.echo: "ok", farB.echo: "fail", b.at: "fail"})
	waitRound(t, ctx, b.vm, 0, map[netip.AddrPort]string{farA.echo: "ok", a.at: "fail"})
	if got, err := r.d.slots().Get(ctx, &phasegatev1.GetRequest{Index: a.slot.GetIndex()}); err != nil || got.GetSlot().GetEgressDroppedPackets() == 0 {
		t.Errorf("slot %d after its guest's checks of a denied address: %d packets dropped (%v), want some",
			a.slot.GetIndex(), got.GetSlot().GetEgressDroppedPackets(), err)
	}
	waitFor(t, time.Minute, "the guest's long connection to far end A", func() bool {
		_, ticks := farA.held()
		return ticks >= 2
	})

	// Policy 2 also allows range B: it takes effect at
	// the next check, and the long connection stays the one it was.
	p2 := egressPolicy([]netip.Prefix{rangeA, rangeB}, nil)
	replacePolicy(t, ctx, r.d.slots(), a, p2)
	off := consoleLen(t, a.vm) // rounds that begin now meet only the new policy
	waitRound(t, ctx, a.vm, off, map[netip.AddrPort]string{farA.echo: "ok", farB.echo: "ok", b.at: "fail"})
	checkPolicy(t, ctx, r.d.slots(), a, p2)
	checkHeld(t, farA, a.vm)

	r.restartUnderAConnection(t, ctx, p2)
	waitRound(t, ctx, b.vm, consoleLen(t, b.vm), map[netip.AddrPort]string{farA.echo: "ok", a.at: "fail"})

	// Policy 3 denies range A: new connections there fail, the
	// established one stays (established traffic is always accepted).
	p3 := egressPolicy([]netip.Prefix{rangeB}, []netip.Prefix{rangeA})
	replacePolicy(t, ctx, r.d.slots(), a, p3)
	off = consoleLen(t, a.vm) // rounds that begin now meet only the new policy
	waitRound(t, ctx, a.vm, off, map[netip.AddrPort]string{farA.echo: "fail", farB.echo: "ok", b.at: "fail"})
	checkHeld(t, farA, a.vm)

	r.releaseEverything(t, ctx)
}

// vmSlotsRig is TestVMInSlots's node, its daemon (d, restarted along the
// test, on addr with flags), the far ends in ranges A and B, and the two
// leased slots with their guests.
type vmSlotsRig struct {
	g          microvm.Guest
	n          *node
	h          *host
	addr       string
	flags      []string
	d          *daemon
	farA, farB *farEnd
	vms        []*vmSlot
}

// newVMSlotsRig makes the node (forwarding on, there only) with its far
// ends and starts the daemon with the guest profile.
func newVMSlotsRig(t *testing.T) *vmSlotsRig {
	t.Helper()
	r := &vmSlotsRig{g: locateGuest(t), n: newNode(t), h: newHost(t), addr: "127.0.0.1:5008"}
	r.h.node = r.n
	run(t, "nsenter", "--net="+r.n.ns, "--", "sysctl", "-q", "-w", "net.ipv4.ip_forward=1")
	r.farA = newFarEnd(t, r.n, "fara", randomSlash30(rangeA), rangeA)
	r.farB = newFarEnd(t, r.n, "farb", randomSlash30(rangeB), rangeB)
	r.flags = append([]string{"--slots=64"}, guestProfileFlags()...)
	r.startDaemon(t)
	return r
}

// startDaemon starts the daemon in the node and waits until it serves.
func (r *vmSlotsRig) startDaemon(t *testing.T) {
	t.Helper()
	r.d = nodeDaemon(t, r.n, r.h, r.addr, r.flags...)
	waitNodeServing(t, r.n, r.addr, time.Minute)
}

// bootGuests leases slots for vm-a and vm-b under policy 1 (range A
// allowed, range B denied), boots a guest in each, probing the far ends
// and each other (vm-a holding a connection to far end A), and waits
// until the node reaches each guest at its slot's address.
func (r *vmSlotsRig) bootGuests(t *testing.T, ctx context.Context) (a, b *vmSlot, farA, farB *farEnd) {
	t.Helper()
	farA, farB = r.farA, r.farB
	p1 := egressPolicy([]netip.Prefix{rangeA}, []netip.Prefix{rangeB})
	for _, owner := range []string{"vm-a", "vm-b"} {
		s, lease := acquireWithPolicy(t, ctx, r.d.slots(), owner, p1)
		inside := netip.MustParsePrefix(s.GetInsideAddress()).Addr()
		r.vms = append(r.vms, &vmSlot{slot: s, lease: lease, at: netip.AddrPortFrom(inside, guestPort)})
	}
	a, b = r.vms[0], r.vms[1]
	a.vm = bootGuest(t, r.g, guestConfig(a.slot, []netip.AddrPort{farA.echo, farB.echo, b.at}, farA.hold))
	b.vm = bootGuest(t, r.g, guestConfig(b.slot, []netip.AddrPort{farA.echo, a.at}, netip.AddrPort{}))
	for _, v := range r.vms {
		if err := v.vm.WaitReady(ctx, r.n.ns, v.at); err != nil {
			t.Fatalf("the node does not reach the guest of slot %d at its address %s: %v", v.slot.GetIndex(), v.at, err)
		}
	}
	return a, b, farA, farB
}

// restartUnderAConnection holds a connection into vm-a's guest through
// every kind of restart (kill -9 and a start, SIGTERM and a start,
// SIGHUP), which must leave the slot's network as it was: the guest's
// view under policy p, and the devices, addresses and rules in its
// namespace; the connection sees no failure.
func (r *vmSlotsRig) restartUnderAConnection(t *testing.T, ctx context.Context, p *phasegatev1.EgressPolicy) {
	t.Helper()
	a, b, farA, farB := r.vms[0], r.vms[1], r.farA, r.farB
	viewA := map[netip.AddrPort]string{farA.echo: "ok", farB.echo: "ok", b.at: "fail"}
	network := slotNetwork(t, a.slot)
	if !strings.Contains(network, "link "+guestTap+" ") || !strings.Contains(network, "table ") {
		t.Fatalf("slot %d's network lists no %s or no nftables table:\n%s", a.slot.GetIndex(), guestTap, network)
	}
	probe := startSteadyProbe(t, r.n.ns, a.at, 100*time.Millisecond)
	r.d.signal(syscall.SIGKILL)
	r.d.wait(30 * time.Second)
	r.startDaemon(t)
	afterRestart(t, ctx, "kill -9 and a new start", r.d, a, p, probe, network, viewA)

	r.d.signal(syscall.SIGTERM)
	if code := r.d.wait(time.Minute); code != 0 {
		t.Fatalf("exit %d after SIGTERM, want 0", code)
	}
	r.startDaemon(t)
	afterRestart(t, ctx, "SIGTERM and a new start", r.d, a, p, probe, network, viewA)

	d := r.d
	upgrades := strings.Count(d.Output(), "SIGHUP: upgrading in place")
	served := strings.Count(d.Output(), "msg=serving ")
	d.signal(syscall.SIGHUP)
	waitFor(t, time.Minute, "the SIGHUP upgrade to begin", func() bool {
		return strings.Count(d.Output(), "SIGHUP: upgrading in place") > upgrades
	})
	waitFor(t, 2*time.Minute, "the upgraded daemon to serve", func() bool {
		return strings.Count(d.Output(), "msg=serving ") > served
	})
	waitNodeServing(t, r.n, r.addr, time.Minute)
	afterRestart(t, ctx, "SIGHUP", d, a, p, probe, network, viewA)
	probe.end()
	echoes, fails := probe.result()
	t.Logf("the connection into the guest across kill -9, SIGTERM and a start, SIGHUP: %d echoes, %d failures", echoes, len(fails))
	if len(fails) > 0 || echoes == 0 {
		t.Errorf("the connection into the guest across the restarts: %d echoes, failures %v", echoes, fails)
	}
}

// releaseEverything stops the VMs (QEMU holds its slot's namespace), then
// releases their leases, and checks every trace of the policies goes with
// them: each released slot as a warm slot never leased, the records idle,
// nothing left after the stop.
func (r *vmSlotsRig) releaseEverything(t *testing.T, ctx context.Context) {
	t.Helper()
	a, b, d := r.vms[0], r.vms[1], r.d
	for _, v := range r.vms {
		if err := v.vm.Stop(10 * time.Second); err != nil {
			t.Fatal(err)
		}
		if _, err := d.slots().Release(ctx, &phasegatev1.ReleaseRequest{Index: v.slot.GetIndex(), LeaseId: v.lease}); err != nil {
			t.Fatalf("Release slot %d: %v", v.slot.GetIndex(), err)
		}
	}
	var fresh *phasegatev1.Slot
	for _, s := range listSlots(t, d.slots(), true) {
		if s.GetState() == phasegatev1.SlotState_SLOT_STATE_WARM && s.GetIndex() != a.slot.GetIndex() && s.GetIndex() != b.slot.GetIndex() {
			fresh = s
			break
		}
	}
	if fresh == nil {
		t.Fatal("no warm slot that was never leased to compare the released ones with")
	}
	for _, v := range r.vms {
		checkReleased(t, ctx, d.slots(), v, fresh)
	}
	d.signal(syscall.SIGTERM)
	if code := d.wait(time.Minute); code != 0 {
		t.Fatalf("exit %d after the last SIGTERM, want 0", code)
	}
	for _, rec := range r.h.assertOnlyRecorded(r.h.prefix) {
		if rec.State != leases.Idle || rec.Owner != "" || rec.Egress != nil {
			t.Errorf("after the releases slot %d is recorded %s for %q with policy %v", rec.Index, rec.State, rec.Owner, rec.Egress)
		}
	}
	r.h.decommission(r.h.prefix)
	r.h.assertClean(r.h.prefix, nil)
}

// guestConfig is the VM of slot s: on its tap, at the profile's fixed
// address, probing probes and holding a connection to hold.
func guestConfig(s *phasegatev1.Slot, probes []netip.AddrPort, hold netip.AddrPort) microvm.Config {
	return microvm.Config{
		Netns: s.GetNetnsPath(), Tap: guestTap, MAC: guestMAC,
		Addr: guestAddr, Gateway: guestGateway, Port: guestPort,
		Probes: probes, Hold: hold,
	}
}

// afterRestart checks what a restart of the daemon (how says what) must
// leave untouched: the lease and its policy in Get, the connection into
// the guest, the slot's network (as slotNetwork lists it) and the guest's
// view of it (a full round of its checks with the results in view).
func afterRestart(t *testing.T, ctx context.Context, how string, d *daemon, v *vmSlot, p *phasegatev1.EgressPolicy,
	probe *steadyProbe, network string, view map[netip.AddrPort]string) {
	t.Helper()
	checkPolicy(t, ctx, d.slots(), v, p)
	if now := slotNetwork(t, v.slot); now != network {
		t.Errorf("after %s slot %d's network changed; before:\n%s\nafter:\n%s", how, v.slot.GetIndex(), network, now)
	}
	waitRound(t, ctx, v.vm, consoleLen(t, v.vm), view)
	if echoes, fails := probe.result(); len(fails) > 0 {
		t.Fatalf("after %s the connection into the guest failed (%d echoes before): %v", how, echoes, fails)
	}
}

// slotNetwork is what a restart must not change in slot s's namespace:
// its links, addresses, routes and nftables rules (with their handles, so
// that rules written again count as changed; without counter values).
func slotNetwork(t *testing.T, s *phasegatev1.Slot) string {
	t.Helper()
	in := func(args ...string) string {
		return run(t, "nsenter", append([]string{"--net=" + s.GetNetnsPath(), "--"}, args...)...)
	}
	links := regexp.MustCompile(`^\d+: (\S+): <([^>]*)>.* link/\S+ (\S+)`)
	var b strings.Builder
	for _, l := range lines(in("ip", "-o", "link", "show")) {
		if m := links.FindStringSubmatch(l); m != nil {
			fmt.Fprintf(&b, "link %s %s %s\n", m[1], m[2], m[3])
		}
	}
	for _, l := range lines(in("ip", "-o", "addr", "show")) {
		f := strings.Fields(l)
		fmt.Fprintf(&b, "addr %s %s %s\n", f[1], f[2], f[3])
	}
	b.WriteString(in("ip", "route", "show", "table", "all"))
	b.WriteString(insideRules(t, s.GetNetnsPath()))
	return b.String()
}

// The slot profile the VM tests run the daemon with: the guest device the
// harness's guests are configured for.
const guestTap = "tap0"

func guestProfileFlags() []string {
	return []string{
		"--slot-guest-tap=" + guestTap,
		"--slot-guest-addr=" + guestAddr.String(),
		"--slot-guest-gateway=" + guestGateway.String(),
	}
}

// egressPolicy is the API's policy of allow and deny lists.
func egressPolicy(allow, deny []netip.Prefix) *phasegatev1.EgressPolicy {
	p := &phasegatev1.EgressPolicy{}
	for _, a := range allow {
		p.Allow = append(p.Allow, a.String())
	}
	for _, d := range deny {
		p.Deny = append(p.Deny, d.String())
	}
	return p
}

// acquireWithPolicy leases a slot for owner with policy p and checks that
// the slot has the profile's guest device.
func acquireWithPolicy(t *testing.T, ctx context.Context, c phasegatev1.SlotsClient, owner string, p *phasegatev1.EgressPolicy) (*phasegatev1.Slot, string) {
	t.Helper()
	resp, err := c.Acquire(ctx, &phasegatev1.AcquireRequest{Owner: owner, RequestId: owner + "-1", EgressPolicy: p})
	if err != nil {
		t.Fatalf("Acquire(%s) with a policy: %v", owner, err)
	}
	s := resp.GetSlot()
	if s.GetGuestInterface() != guestTap || s.GetGuestAddress() != guestAddr.String() || s.GetGuestGateway() != guestGateway.String() {
		t.Fatalf("slot %d's guest device: %q %q %q, want %s %s %s", s.GetIndex(),
			s.GetGuestInterface(), s.GetGuestAddress(), s.GetGuestGateway(), guestTap, guestAddr, guestGateway)
	}
	if !proto.Equal(s.GetEgressPolicy(), p) {
		t.Fatalf("slot %d's policy after Acquire: %v, want %v", s.GetIndex(), s.GetEgressPolicy(), p)
	}
	return s, resp.GetLeaseId()
}

// replacePolicy gives v's lease policy p.
func replacePolicy(t *testing.T, ctx context.Context, c phasegatev1.SlotsClient, v *vmSlot, p *phasegatev1.EgressPolicy) {
	t.Helper()
	if _, err := c.SetEgressPolicy(ctx, &phasegatev1.SetEgressPolicyRequest{Index: v.slot.GetIndex(), LeaseId: v.lease, EgressPolicy: p}); err != nil {
		t.Fatalf("SetEgressPolicy(slot %d): %v", v.slot.GetIndex(), err)
	}
}

// checkPolicy checks that Get shows v's lease with policy p.
func checkPolicy(t *testing.T, ctx context.Context, c phasegatev1.SlotsClient, v *vmSlot, p *phasegatev1.EgressPolicy) {
	t.Helper()
	var s *phasegatev1.Slot
	// A lease restored by a new start is verified in the background, after
	// the daemon serves: until then Get says so.
	waitFor(t, 30*time.Second, "the restored lease verified", func() bool {
		got, err := c.Get(ctx, &phasegatev1.GetRequest{Index: v.slot.GetIndex()})
		if err != nil {
			t.Fatalf("Get(slot %d): %v", v.slot.GetIndex(), err)
		}
		s = got.GetSlot()
		return s.GetState() != phasegatev1.SlotState_SLOT_STATE_VERIFYING
	})
	if s.GetState() != phasegatev1.SlotState_SLOT_STATE_ACQUIRED || s.GetOwner() != v.slot.GetOwner() || !proto.Equal(s.GetEgressPolicy(), p) {
		t.Fatalf("slot %d: %v for %q with policy %v, want acquired for %q with %v", s.GetIndex(), s.GetState(), s.GetOwner(), s.GetEgressPolicy(), v.slot.GetOwner(), p)
	}
}

// checkReleased checks that nothing of v's lease is left while the daemon
// runs: QEMU is gone, Get shows no lease and no policy, and if the slot is
// kept (warm, for the next lease) it tracks none of the guest's
// connections and its rules are those of fresh, a slot that was never
// leased, but for each slot's own addresses.
func checkReleased(t *testing.T, ctx context.Context, c phasegatev1.SlotsClient, v *vmSlot, fresh *phasegatev1.Slot) {
	t.Helper()
	if exited, _ := v.vm.Exited(); !exited {
		t.Errorf("slot %d: QEMU still runs", v.slot.GetIndex())
	}
	got, err := c.Get(ctx, &phasegatev1.GetRequest{Index: v.slot.GetIndex()})
	if err != nil {
		t.Fatalf("Get(slot %d) after Release: %v", v.slot.GetIndex(), err)
	}
	s := got.GetSlot()
	if s.GetState() == phasegatev1.SlotState_SLOT_STATE_ACQUIRED || s.GetOwner() != "" || s.GetEgressPolicy() != nil {
		t.Errorf("slot %d after Release: %v for %q with policy %v", s.GetIndex(), s.GetState(), s.GetOwner(), s.GetEgressPolicy())
	}
	if _, err := os.Stat(v.slot.GetNetnsPath()); err != nil {
		t.Logf("slot %d: destroyed with its namespace after Release", s.GetIndex())
		return
	}
	// The guest's connections: conntrack entries a next lease's traffic
	// would match as established.
	var entries int
	if err := microvm.InNamespace(v.slot.GetNetnsPath(), func() error {
		flows, err := netlink.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET)
		entries = len(flows)
		return err
	}); err != nil {
		t.Errorf("slot %d: conntrack entries: %v", s.GetIndex(), err)
	} else if entries > 0 {
		t.Errorf("slot %d after Release: %d conntrack entries of its guest's connections left", s.GetIndex(), entries)
	}
	if got, want := slotRules(t, v.slot), slotRules(t, fresh); got != want {
		t.Errorf("slot %d after Release has rules a never-leased slot (%d) has not; released:\n%s\nnever leased:\n%s",
			s.GetIndex(), fresh.GetIndex(), got, want)
	}
}

// slotRules is the nftables ruleset in slot s's namespace without counters
// and handles, its own addresses replaced by placeholders so that two
// slots' rules compare.
func slotRules(t *testing.T, s *phasegatev1.Slot) string {
	t.Helper()
	rules := run(t, "nsenter", "--net="+s.GetNetnsPath(), "--", "nft", "-s", "list", "ruleset")
	for name, a := range map[string]string{"INSIDE": s.GetInsideAddress(), "HOST": s.GetHostAddress()} {
		rules = strings.ReplaceAll(rules, netip.MustParsePrefix(a).Addr().String(), name)
	}
	return rules
}
