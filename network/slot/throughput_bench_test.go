package slot_test

import (
	"context"
	"net/netip"
	"os/exec"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/internal/iperf"
	"github.com/phasegate/phasegate/network/egress"
	"github.com/phasegate/phasegate/network/internal/nettest"
	"github.com/phasegate/phasegate/network/netns"
	"github.com/phasegate/phasegate/network/ports"
	"github.com/phasegate/phasegate/network/slot"
)

// BenchmarkThroughput measures TCP between the host and a namespace, each
// way, one 2 s iperf3 run per iteration, reported as Mbit/s on the wire:
// through a bare veth pair with nothing of phasegate on it (the
// baseline), and through a slot with every rule of a lease without limits
// in place: its anti-spoofing element, an egress policy with an allow and
// a deny list, a published port, and the lease's counters (the kernel's
// own, which every device keeps). docs/BENCHMARKS.md, "A slot's datapath
// beside a bare veth pair"; -count interleaves the two:
//
//	go test -run '^$' -bench Throughput -benchtime 3x -count 3 ./network/slot/
func BenchmarkThroughput(b *testing.B) {
	ruled := ruledSlot(b)
	bare := barePair(b)
	for _, way := range []struct {
		name string
		out  bool
	}{{"into", false}, {"out", true}} {
		for _, to := range []struct {
			name string
			s    *slot.Slot
		}{{"bare", bare}, {"slot", ruled}} {
			b.Run(way.name+"/"+to.name, func(b *testing.B) {
				var sum float64
				for b.Loop() {
					sum += iperf.Throughput(b, "", to.s.NetnsPath, to.s.InsideAddr.Addr(), 2*time.Second, way.out)
				}
				b.ReportMetric(sum/float64(b.N)/1e6, "Mbit/s")
			})
		}
	}
}

// ruledSlot makes a real slot with an egress policy and a published port.
func ruledSlot(b *testing.B) *slot.Slot {
	ctx := context.Background()
	m := nettest.New(b, 1).Manager(b)
	s, err := m.Create(ctx, 1)
	if err != nil {
		b.Fatal(err)
	}
	p := egress.Policy{Allow: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}, Deny: []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")}}
	if err := m.ApplyEgress(ctx, s, p); err != nil {
		b.Fatal(err)
	}
	published := []ports.Mapping{{HostPort: 18080, SlotPort: 8080, Protocol: ports.TCP}}
	if err := m.Ports().Set(ctx, s.HostIf, s.InsideAddr.Addr(), nil, published); err != nil {
		b.Fatal(err)
	}
	return s
}

// barePair makes, with the names and addresses of a playground of its own
// whose manager is never made (so no table of phasegate's exists for it),
// a namespace and a veth pair into it, addressed and up, and nothing else.
func barePair(b *testing.B) *slot.Slot {
	env := nettest.New(b, 1)
	s := env.Config.Slot(1)
	ctx := context.Background()
	var err error
	if s.NetnsPath, err = netns.Create(ctx, env.Config.NetnsDir, s.NetnsName); err != nil {
		b.Fatal(err)
	}
	fd, err := netns.Open(s.NetnsPath)
	if err != nil {
		b.Fatal(err)
	}
	defer unix.Close(fd)
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: s.HostIf}, PeerName: s.InsideIf, PeerNamespace: netlink.NsFd(fd)}
	if err := netlink.LinkAdd(veth); err != nil {
		b.Fatalf("add %s: %v", s.HostIf, err)
	}
	for _, c := range [][]string{
		{"ip", "addr", "add", s.HostAddr.String(), "dev", s.HostIf},
		{"ip", "link", "set", s.HostIf, "up"},
		{"nsenter", "--net=" + s.NetnsPath, "ip", "addr", "add", s.InsideAddr.String(), "dev", s.InsideIf},
		{"nsenter", "--net=" + s.NetnsPath, "ip", "link", "set", s.InsideIf, "up"},
		{"nsenter", "--net=" + s.NetnsPath, "ip", "link", "set", "lo", "up"},
	} {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			b.Fatalf("%v: %v: %s", c, err, out)
		}
	}
	return &s
}
