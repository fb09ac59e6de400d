package nft_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/phasegate/phasegate/network/egress"
	"github.com/phasegate/phasegate/network/internal/fakehost"
	"github.com/phasegate/phasegate/network/nft"
)

// metadata plays the cloud metadata service: an address the outside
// network holds and the host routes to it.
var metadata = netip.MustParseAddr("169.254.169.254")

// egressHost is a fake host whose table has egress defaults that deny the
// outside network unless a lease allows it. The slots have no table of
// their own inside: everything the tests see is the host's doing, as
// after a tenant's `nft flush ruleset` in its namespace.
func egressHost(t *testing.T, n int, d egress.Defaults) (*fakehost.Host, *nft.Table) {
	t.Helper()
	h := fakehost.New(t, n, true)
	tbl := h.SlotTable(t, nft.WithEgress(d), nft.WithIsolation(nft.Isolation{HostTCPPorts: []uint16{portAllowed}}))
	return h, tbl
}

// egressDrops reads the drop count of slot s's egress chain.
func egressDrops(t *testing.T, tbl *nft.Table, name string) func() uint64 {
	return func() uint64 {
		st, err := tbl.EgressOf(context.Background(), name)
		if err != nil {
			t.Fatal(err)
		}
		return st.Drops
	}
}

func setEgress(t *testing.T, tbl *nft.Table, name string, p egress.Policy) {
	t.Helper()
	if err := tbl.SetEgress(context.Background(), name, p); err != nil {
		t.Fatalf("SetEgress %s: %v", name, err)
	}
}

func cidrs(s ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, x := range s {
		out = append(out, netip.MustParsePrefix(x))
	}
	return out
}

// A lease's egress policy holds on the host, where the tenant cannot
// reach it: with nothing inside the slot, the defaults deny the outside,
// the lease's allow list wins over them, deny-all drops everything, a
// replacement keeps established flows, and one slot's policy is not
// another's. Every drop is counted in the slot's own chain.
func TestEgressPolicyOnTheHost(t *testing.T) {
	d := egress.Defaults{AlwaysDeny: cidrs("192.0.2.0/24")}
	h, tbl := egressHost(t, 2, d)
	ctx := context.Background()
	s1, s2 := h.Slots[0], h.Slots[1]
	out := netip.AddrPortFrom(fakehost.OutsideUplink.Addr(), portOutside)
	ln := listenUDP(t, h.Outside, out)
	counted := egressDrops(t, tbl, s1.HostIf)

	if !udpArrivesCounted(t, counted, s1.NetnsPath, out, ln) {
		t.Fatal("without a policy the slot does not reach the outside")
	}
	setEgress(t, tbl, s1.HostIf, egress.Policy{})
	if udpArrivesCounted(t, counted, s1.NetnsPath, out, ln) {
		t.Error("the always-denied outside reached under a policy")
	}
	st, err := tbl.EgressOf(ctx, s1.HostIf)
	if want := (egress.Policy{}).Fingerprint(d); err != nil || st.Fingerprint != want || st.Drops == 0 {
		t.Errorf("EgressOf = %+v, %v; want fingerprint %s and drops", st, err, want)
	}
	if !udpArrivesCounted(t, egressDrops(t, tbl, s2.HostIf), s2.NetnsPath, out, ln) {
		t.Error("slot 2, without a policy, lost the outside to slot 1's")
	}

	// An established flow: replies keep it up across a replacement.
	refl := reflect(t, h)
	setEgress(t, tbl, s1.HostIf, egress.Policy{Allow: cidrs("192.0.2.2/32")})
	if !udpArrivesCounted(t, counted, s1.NetnsPath, out, ln) {
		t.Error("the lease's allow list does not win over the always-denied set")
	}
	c, err := fakehost.DialUDP(s1.NetnsPath, refl)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if !echoes(c, "before") {
		t.Fatal("the reflector does not answer an allowed slot")
	}
	// Lists longer than a few ranges are sets rather than rules: the same
	// verdicts.
	long := func(last string) []netip.Prefix { return append(ranges(9, 20), netip.MustParsePrefix(last)) }
	setEgress(t, tbl, s1.HostIf, egress.Policy{Allow: long("192.0.2.2/32")})
	if !udpArrivesCounted(t, counted, s1.NetnsPath, out, ln) {
		t.Error("a long allow list does not win over the always-denied set")
	}
	if st, _ := tbl.EgressOf(ctx, s1.HostIf); st.Fingerprint != (egress.Policy{Allow: long("192.0.2.2/32")}).Fingerprint(d) {
		t.Errorf("EgressOf after a long list: %+v", st)
	}
	h2, tbl2 := egressHost(t, 1, egress.Defaults{}) // nothing always denied: the lease's deny list alone
	out2 := netip.AddrPortFrom(fakehost.OutsideUplink.Addr(), portOutside)
	ln2 := listenUDP(t, h2.Outside, out2)
	setEgress(t, tbl2, h2.Slots[0].HostIf, egress.Policy{Deny: long("192.0.2.0/24")})
	if udpArrivesCounted(t, egressDrops(t, tbl2, h2.Slots[0].HostIf), h2.Slots[0].NetnsPath, out2, ln2) {
		t.Error("a long deny list let its last range through")
	}
	setEgress(t, tbl, s1.HostIf, egress.Policy{Allow: cidrs("192.0.2.2/32")})
	setEgress(t, tbl, s1.HostIf, egress.Policy{DenyAll: true})
	if !echoes(c, "after") {
		t.Error("an established flow was cut by a replacement")
	}
	if udpArrivesCounted(t, counted, s1.NetnsPath, out, ln) {
		t.Error("deny_all let a new flow out")
	}

	if err := tbl.ClearEgress(ctx, s1.HostIf, s2.HostIf); err != nil { // s2 has none: fine
		t.Fatal(err)
	}
	if names, err := tbl.EgressNames(ctx); err != nil || len(names) != 0 {
		t.Errorf("EgressNames after ClearEgress = %q, %v", names, err)
	}
	if _, ok, err := fakehost.UDPReaches(s1.NetnsPath, ln, 5*time.Second); err != nil || !ok {
		t.Errorf("the slot does not reach the outside once its policy is cleared: %v", err)
	}
}

// echoes sends msg on c and says whether the reflector sent it back.
func echoes(c *net.UDPConn, msg string) bool {
	buf := make([]byte, 64)
	for range 50 {
		if _, err := c.Write([]byte(msg)); err != nil {
			return false
		}
		_ = c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		if n, err := c.Read(buf); err == nil && string(buf[:n]) == msg {
			return true
		}
	}
	return false
}

// With RedirectTCP the slot's own table sends TCP to the egress proxy at
// its gateway; on the host, TCP that went around it (the tenant removed
// the redirection) is dropped, while the proxy itself stays reachable.
func TestEgressRedirectHoldsOnTheHost(t *testing.T) {
	d := egress.Defaults{ProxyPort: portAllowed}
	h, tbl := egressHost(t, 1, d)
	s1 := h.Slots[0]
	out := netip.AddrPortFrom(fakehost.OutsideUplink.Addr(), portOutside)
	listenTCP(t, h.Outside, out)
	listenTCP(t, h.Path, netip.AddrPortFrom(netip.IPv4Unspecified(), portAllowed))
	counted := egressDrops(t, tbl, s1.HostIf)
	if err := tbl.SetEgress(context.Background(), s1.HostIf, egress.Policy{RedirectTCP: true}); err != nil {
		t.Fatal(err)
	}
	if tcpConnectsCounted(t, counted, s1.NetnsPath, out) {
		t.Error("TCP around the egress proxy reached the outside")
	}
	if !tcpConnectsCounted(t, counted, s1.NetnsPath, netip.AddrPortFrom(s1.HostAddr.Addr(), portAllowed)) {
		t.Error("the egress proxy at the slot's gateway is not reachable")
	}
	// Without a proxy, redirect_tcp is refused and nothing is written.
	noProxy, err := nft.New(h.Config.TableName(), nft.WithNetNS(h.Path))
	if err != nil {
		t.Fatal(err)
	}
	if err := noProxy.SetEgress(context.Background(), s1.HostIf, egress.Policy{RedirectTCP: true}); err == nil {
		t.Error("redirect_tcp accepted without a proxy")
	}
}

// Link-local destinations (the cloud metadata service) are dropped for
// every slot, with or without a policy, unless the daemon always allows
// them or the lease does; the slots' own link-local network (the default
// slot CIDR is link-local) is not caught by it.
func TestLinkLocalIsDropped(t *testing.T) {
	for _, tc := range []struct {
		name    string
		allow   []netip.Prefix // the daemon's always-allowed
		policy  *egress.Policy
		reached bool
	}{
		{"no policy", nil, nil, false},
		{"a policy without it", nil, &egress.Policy{}, false},
		{"always allowed", cidrs("169.254.169.254/32"), nil, true},
		{"allowed by the lease", nil, &egress.Policy{Allow: cidrs("169.254.169.254/32")}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, tbl := egressHost(t, 1, egress.Defaults{AlwaysAllow: tc.allow})
			s1 := h.Slots[0]
			if err := fakehost.Route(h.Path, netip.PrefixFrom(metadata, 32), fakehost.OutsideUplink.Addr()); err != nil {
				t.Fatal(err)
			}
			if err := fakehost.AddAddr(h.Outside, "eth0", netip.PrefixFrom(metadata, 32)); err != nil {
				t.Fatal(err)
			}
			if tc.policy != nil {
				setEgress(t, tbl, s1.HostIf, *tc.policy)
			}
			ln := listenUDP(t, h.Outside, netip.AddrPortFrom(metadata, 80))
			count := func() uint64 { return drops(t, tbl).LinkLocal + egressDrops(t, tbl, s1.HostIf)() }
			if got := udpArrivesCounted(t, count, s1.NetnsPath, netip.AddrPortFrom(metadata, 80), ln); got != tc.reached {
				t.Errorf("metadata reached = %v, want %v", got, tc.reached)
			}
			// The slot's own gateway, in the link-local slot network,
			// stays reachable on an offered port.
			gw := netip.AddrPortFrom(s1.HostAddr.Addr(), portAllowed)
			listenTCP(t, h.Path, netip.AddrPortFrom(netip.IPv4Unspecified(), portAllowed))
			if tc.policy == nil && !tcpConnects(t, tbl, s1.NetnsPath, gw, toHost) {
				t.Error("the slot's own link-local gateway is caught by the link-local rule")
			}
		})
	}
}

// A slot's egress chain goes with it: Remove takes it with the element (one
// name or many, some without a chain), and AddNew clears one left under the
// name of a new slot.
func TestEgressChainGoesWithTheSlot(t *testing.T) {
	h, tbl := egressHost(t, 4, egress.Defaults{})
	ctx := context.Background()
	names := h.HostIfs()
	for _, n := range names[:3] {
		setEgress(t, tbl, n, egress.Policy{DenyAll: true})
	}
	if got, err := tbl.EgressNames(ctx); err != nil || !slices.Equal(got, slices.Sorted(slices.Values(names[:3]))) {
		t.Fatalf("EgressNames = %q, %v; want %q", got, err, names[:3])
	}
	if err := tbl.Remove(ctx, names[0]); err != nil {
		t.Fatal(err)
	}
	if err := tbl.Remove(ctx, names[0]); err != nil {
		t.Errorf("second Remove of one name: %v", err)
	}
	if err := tbl.Remove(ctx, names[1], names[3], "nothere"); err != nil {
		t.Fatal(err)
	}
	if got, _ := tbl.EgressNames(ctx); !slices.Equal(got, names[2:3]) {
		t.Errorf("EgressNames after Remove = %q, want %q", got, names[2:3])
	}
	if got, _ := tbl.List(ctx); !slices.Equal(got, names[2:3]) {
		t.Errorf("List after Remove = %q, want %q", got, names[2:3])
	}
	// A chain left without its element (as if by an older build) is
	// cleared by the next slot's AddNew, so the new slot starts open.
	setEgress(t, tbl, names[0], egress.Policy{DenyAll: true})
	if err := tbl.AddNew(ctx, names[0]); err != nil {
		t.Fatal(err)
	}
	if st, err := tbl.EgressOf(ctx, names[0]); err != nil || st.Fingerprint != "" {
		t.Errorf("EgressOf after AddNew = %+v, %v; want none", st, err)
	}
	out := netip.AddrPortFrom(fakehost.OutsideUplink.Addr(), portOutside)
	if _, ok, err := fakehost.UDPReaches(h.Slots[0].NetnsPath, listenUDP(t, h.Outside, out), 5*time.Second); err != nil || !ok {
		t.Errorf("a new slot inherited the old chain's policy: %v", err)
	}
	// Ensure keeps the slots' chains.
	if err := tbl.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if st, err := tbl.EgressOf(ctx, names[2]); err != nil || st.Fingerprint == "" {
		t.Errorf("Ensure lost a slot's egress chain: %+v, %v", st, err)
	}
}

// A start that finds the table as its policy says leaves it alone: no
// transaction (the counters keep their counts); a table whose fixed rules
// someone changed, or whose policy or defaults differ, is written again.
func TestEnsureWritesOnlyWhatDiffers(t *testing.T) {
	d := egress.Defaults{AlwaysDeny: cidrs("10.0.0.0/8")}
	h, tbl := egressHost(t, 2, d)
	ctx := context.Background()
	sendRaw(t, h.Slots[0].NetnsPath, netip.AddrPortFrom(h.Slots[1].InsideAddr.Addr(), 1), netip.AddrPortFrom(fakehost.OutsideUplink.Addr(), 9), "spoofed")
	waitFor(t, "the spoofed datagram counted", func() bool { return drops(t, tbl).Spoofed > 0 })
	if err := tbl.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if drops(t, tbl).Spoofed == 0 {
		t.Error("Ensure of an intact table wrote it again (its counters were reset)")
	}
	// Root deletes a rule of the table: the next Ensure puts it back.
	out, err := exec.Command("nsenter", "--net="+h.Path, "nft", "-a", "list", "chain", "inet", tbl.Name(), nft.ChainInput).CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	handle := ""
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, "to-host") {
			handle = l[strings.LastIndex(l, " ")+1:]
		}
	}
	if out, err := exec.Command("nsenter", "--net="+h.Path, "nft", "delete", "rule", "inet", tbl.Name(), nft.ChainInput, "handle", handle).CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if err := tbl.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := tbl.RuleCount(ctx); err != nil || n != nft.FixedRules {
		t.Errorf("RuleCount after Ensure of a table missing a rule = %d, %v", n, err)
	}
	// Other defaults (a host address more, say): the sets are written.
	other, err := nft.New(tbl.Name(), nft.WithNetNS(h.Path), nft.WithSlotNetwork(h.Config.CIDR),
		nft.WithEgress(egress.Defaults{AlwaysDeny: cidrs("10.0.0.0/8", "198.18.0.0/15")}), nft.WithIsolation(tbl.Isolation()))
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	out, err = exec.Command("nsenter", "--net="+h.Path, "nft", "list", "set", "inet", tbl.Name(), nft.SetAlwaysDeny).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "198.18.0.0/15") {
		t.Errorf("the always-denied set after Ensure with other defaults:\n%s (%v)", out, err)
	}
}

// The defaults a table gives name the ranges its rule against link-local
// destinations drops, the slot network cut out, so that what a policy
// lets out (egress.Narrow) is what the table does; they are not written
// into any policy's fingerprint.
func TestEgressDefaultsNameTheLinkLocalRule(t *testing.T) {
	d := egress.Defaults{AlwaysDeny: egress.DefaultAlwaysDeny}
	for _, tc := range []struct {
		slots netip.Prefix
		want  string
	}{
		{netip.MustParsePrefix("169.254.100.0/22"), "[169.254.0.0/18 169.254.64.0/19 169.254.96.0/22 169.254.104.0/21 169.254.112.0/20 169.254.128.0/17]"},
		{netip.MustParsePrefix("100.64.0.0/18"), "[169.254.0.0/16]"},
	} {
		tbl, err := nft.New("pgtest", nft.WithEgress(d), nft.WithSlotNetwork(tc.slots))
		if err != nil {
			t.Fatal(err)
		}
		got := tbl.EgressDefaults()
		if s := fmt.Sprint(got.LinkLocal); s != tc.want {
			t.Errorf("slot network %s: LinkLocal %s, want %s", tc.slots, s, tc.want)
		}
		var p egress.Policy
		if p.Fingerprint(got) != p.Fingerprint(d) {
			t.Errorf("slot network %s: the link-local ranges changed a policy's fingerprint", tc.slots)
		}
	}
}
