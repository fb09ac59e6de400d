package ports_test

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/phasegate/phasegate/network/internal/fakehost"
	"github.com/phasegate/phasegate/network/nft"
	"github.com/phasegate/phasegate/network/ports"
)

// Ports of these tests' services, inside the test's namespaces.
const (
	hostPort  = 18080 // published, to slot 1's slotPort
	slotPort  = 8080  // slot 1's published service
	innerPort = 8081  // slot 1's service that is not published
)

// rig is a fake host (two slots and an outside network) with the slot
// table and its published ports, and slot 1 serving on slotPort and
// innerPort: each connection is answered with the slot's name.
type rig struct {
	h  *fakehost.Host
	fw *nft.Table
	pt *ports.Table
}

func newRig(t *testing.T) *rig {
	t.Helper()
	h := fakehost.New(t, 2, true)
	fw, pt := portsOf(t, h)
	for _, p := range []uint16{slotPort, innerPort} {
		serve(t, h.Slots[0].NetnsPath, netip.AddrPortFrom(h.Slots[0].InsideAddr.Addr(), p), "slot1")
	}
	return &rig{h: h, fw: fw, pt: pt}
}

// portsOf writes the slot table and its published ports' chains into
// fake host h.
func portsOf(t testing.TB, h *fakehost.Host) (*nft.Table, *ports.Table) {
	t.Helper()
	fw := h.SlotTable(t)
	pt := ports.New(fw)
	if err := pt.Ensure(context.Background()); err != nil {
		t.Fatal(err)
	}
	return fw, pt
}

// serve answers every connection to addr in the namespace at path with
// name, until the test ends.
func serve(t *testing.T, path string, addr netip.AddrPort, name string) {
	t.Helper()
	ln, err := fakehost.ListenTCP(path, addr)
	if err != nil {
		t.Fatal(err)
	}
	fakehost.Serve(t, ln, func(c net.Conn) {
		_, _ = c.Write([]byte(name + "\n"))
		c.Close()
	})
}

// dial connects from the namespace at from to to within wait and answers
// the service's name ("" when no connection came up).
func dial(t *testing.T, from string, to netip.AddrPort, wait time.Duration) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	c, err := fakehost.DialTCP(ctx, from, to)
	if err != nil {
		return ""
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(wait))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatalf("read from %s: %v", to, err)
	}
	return strings.TrimSpace(line)
}

func (r *rig) publish(t *testing.T, old, ms []ports.Mapping) {
	t.Helper()
	s := r.h.Slots[0]
	if err := r.pt.Set(context.Background(), s.HostIf, s.InsideAddr.Addr(), old, ms); err != nil {
		t.Fatal(err)
	}
}

func TestPublishedPortIsReachedFromEverywhereItShouldBe(t *testing.T) {
	r := newRig(t)
	m := ports.Mapping{HostPort: hostPort, SlotPort: slotPort, Protocol: ports.TCP}
	r.publish(t, nil, []ports.Mapping{m})
	host := fakehost.HostUplink.Addr()
	s1, s2 := r.h.Slots[0], r.h.Slots[1]
	for _, c := range []struct {
		name string
		from string
		to   netip.AddrPort
	}{
		{"another host, to the host's address", r.h.Outside, netip.AddrPortFrom(host, hostPort)},
		{"the host, on its address", r.h.Path, netip.AddrPortFrom(host, hostPort)},
		{"the host, on 127.0.0.1", r.h.Path, netip.MustParseAddrPort("127.0.0.1:18080")},
		{"the slot itself (hairpin), at the host's address", s1.NetnsPath, netip.AddrPortFrom(host, hostPort)},
		{"the slot itself (hairpin), at its gateway", s1.NetnsPath, netip.AddrPortFrom(s1.HostAddr.Addr(), hostPort)},
		{"another slot, at the host's address", s2.NetnsPath, netip.AddrPortFrom(host, hostPort)},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := dial(t, c.from, c.to, 5*time.Second); got != "slot1" {
				t.Fatalf("dial %s: answered %q, want slot1", c.to, got)
			}
		})
	}
}

func TestPublishedPortOpensThatPortAlone(t *testing.T) {
	r := newRig(t)
	r.publish(t, nil, []ports.Mapping{{HostPort: hostPort, SlotPort: slotPort, Protocol: ports.TCP}})
	s1, s2 := r.h.Slots[0], r.h.Slots[1]
	host := fakehost.HostUplink.Addr()
	// The positive control first: the path works for the published port.
	if got := dial(t, s2.NetnsPath, netip.AddrPortFrom(host, hostPort), 5*time.Second); got != "slot1" {
		t.Fatalf("slot 2 to the published port: %q", got)
	}
	ctx := context.Background()
	before, err := r.fw.Drops(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		from string
		to   netip.AddrPort
	}{
		{"slot 2 to slot 1's unpublished port", s2.NetnsPath, netip.AddrPortFrom(s1.InsideAddr.Addr(), innerPort)},
		{"slot 2 to slot 1's published slot port, not through the host", s2.NetnsPath, netip.AddrPortFrom(s1.InsideAddr.Addr(), slotPort)},
		{"another host to slot 1's unpublished port", r.h.Outside, netip.AddrPortFrom(host, innerPort)},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := dial(t, c.from, c.to, 700*time.Millisecond); got != "" {
				t.Fatalf("dial %s: answered %q, want no connection", c.to, got)
			}
		})
	}
	after, err := r.fw.Drops(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if after.SlotToSlot <= before.SlotToSlot {
		t.Errorf("slot-to-slot drops %d -> %d: the table did not drop slot 2's connections", before.SlotToSlot, after.SlotToSlot)
	}
}

func TestWithdrawnPortLeavesNoElement(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	ms := []ports.Mapping{
		{HostPort: hostPort, SlotPort: slotPort, Protocol: ports.TCP},
		{HostIP: fakehost.HostUplink.Addr(), HostPort: hostPort + 1, SlotPort: slotPort, Protocol: ports.UDP},
	}
	r.publish(t, nil, ms)
	if got, err := r.pt.List(ctx); err != nil || len(got) != 2 {
		t.Fatalf("List = %v, %v; want 2 entries", got, err)
	}
	r.publish(t, ms, nil)
	if got, err := r.pt.List(ctx); err != nil || len(got) != 0 {
		t.Fatalf("List after withdrawal = %v, %v; want none", got, err)
	}
	for _, m := range []string{ports.MapAny, ports.MapAddr} {
		if out := nftIn(t, r.h.Path, "list", "map", "inet", r.fw.Name(), m); strings.Contains(out, "elements") {
			t.Fatalf("an element is left:\n%s", out)
		}
	}
	if got := dial(t, r.h.Outside, netip.AddrPortFrom(fakehost.HostUplink.Addr(), hostPort), 700*time.Millisecond); got != "" {
		t.Fatalf("the withdrawn port still answers: %q", got)
	}
	// Withdrawing again is no error.
	r.publish(t, ms, nil)
}

func TestSyncRepairsADeletedElement(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	m := ports.Mapping{HostPort: hostPort, SlotPort: slotPort, Protocol: ports.TCP}
	r.publish(t, nil, []ports.Mapping{m})
	nftIn(t, r.h.Path, "flush", "map", "inet", r.fw.Name(), ports.MapAny)
	stray := ports.Entry{Mapping: ports.Mapping{HostPort: 1, SlotPort: 1, Protocol: ports.UDP}, To: r.h.Slots[1].InsideAddr.Addr()}
	if err := r.pt.Set(ctx, "", stray.To, nil, []ports.Mapping{stray.Mapping}); err != nil {
		t.Fatal(err)
	}
	want := []ports.Entry{{Mapping: m, To: r.h.Slots[0].InsideAddr.Addr()}}
	added, removed, err := r.pt.Sync(ctx, want, []string{r.h.Slots[0].HostIf})
	if err != nil || added != 1 || removed != 1 {
		t.Fatalf("Sync = %d added, %d removed, %v; want 1, 1", added, removed, err)
	}
	if got := dial(t, r.h.Outside, netip.AddrPortFrom(fakehost.HostUplink.Addr(), hostPort), 5*time.Second); got != "slot1" {
		t.Fatalf("after the repair: %q", got)
	}
}

func TestTenantFlushingItsRulesetKeepsTheMapping(t *testing.T) {
	r := newRig(t)
	r.publish(t, nil, []ports.Mapping{{HostPort: hostPort, SlotPort: slotPort, Protocol: ports.TCP}})
	nftIn(t, r.h.Slots[0].NetnsPath, "flush", "ruleset")
	if got := dial(t, r.h.Outside, netip.AddrPortFrom(fakehost.HostUplink.Addr(), hostPort), 5*time.Second); got != "slot1" {
		t.Fatalf("after the slot's root flushed its ruleset: %q", got)
	}
}

func TestClaimRefusesWhatIsTaken(t *testing.T) {
	h := fakehost.New(t, 1, true)
	host := fakehost.HostUplink.Addr()
	ln, err := fakehost.ListenTCP(h.Path, netip.AddrPortFrom(host, 18090))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	udp, err := fakehost.ListenUDP(h.Path, netip.AddrPortFrom(netip.IPv4Unspecified(), 18091))
	if err != nil {
		t.Fatal(err)
	}
	defer udp.Close()
	o := ports.NewOwners(h.Path)
	to := h.Slots[0].InsideAddr.Addr()
	mine := ports.Mapping{HostPort: 18080, SlotPort: 80, Protocol: ports.TCP}
	if err := o.Claim("lease-a", to, []ports.Mapping{mine}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		m    ports.Mapping
		want error
	}{
		{"published by another lease", mine, ports.ErrTaken},
		{"published by another lease on every address, asked on one", ports.Mapping{HostIP: host, HostPort: 18080, SlotPort: 81, Protocol: ports.TCP}, ports.ErrTaken},
		{"a TCP listener of the host, asked on every address", ports.Mapping{HostPort: 18090, SlotPort: 80, Protocol: ports.TCP}, ports.ErrBound},
		{"a TCP listener of the host, on its address", ports.Mapping{HostIP: host, HostPort: 18090, SlotPort: 80, Protocol: ports.TCP}, ports.ErrBound},
		{"a UDP socket of the host", ports.Mapping{HostPort: 18091, SlotPort: 80, Protocol: ports.UDP}, ports.ErrBound},
		{"an address not the host's", ports.Mapping{HostIP: netip.MustParseAddr("203.0.113.9"), HostPort: 18092, SlotPort: 80, Protocol: ports.TCP}, ports.ErrNotHost},
		{"a port 0", ports.Mapping{HostPort: 0, SlotPort: 80, Protocol: ports.TCP}, ports.ErrInvalid},
	} {
		t.Run(c.name, func(t *testing.T) {
			if err := o.Claim("lease-b", to, []ports.Mapping{c.m}); !errors.Is(err, c.want) {
				t.Fatalf("Claim(%s) = %v, want %v", c.m, err, c.want)
			}
			if got := o.Of("lease-b"); len(got) != 0 {
				t.Fatalf("a refused claim holds %v", got)
			}
		})
	}
	// The same port over UDP is free; the lease's own claim again is fine.
	if err := o.Claim("lease-b", to, []ports.Mapping{{HostPort: 18080, SlotPort: 80, Protocol: ports.UDP}}); err != nil {
		t.Fatalf("UDP 18080 beside TCP 18080: %v", err)
	}
	if err := o.Claim("lease-a", to, []ports.Mapping{mine}); err != nil {
		t.Fatalf("the owner's claim again: %v", err)
	}
	o.Drop("lease-a")
	if err := o.Claim("lease-b", to, []ports.Mapping{mine}); err != nil {
		t.Fatalf("after the owner dropped it: %v", err)
	}
}

// nftIn runs nft with args in the namespace at path and answers its output.
func nftIn(t *testing.T, path string, args ...string) string {
	t.Helper()
	out, err := exec.Command("nsenter", append([]string{"--net=" + path, "nft"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("nft %v in %s: %v\n%s", args, path, err, out)
	}
	return string(out)
}
