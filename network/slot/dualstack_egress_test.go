package slot_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/network/egress"
	"github.com/phasegate/phasegate/network/internal/nettest"
	"github.com/phasegate/phasegate/network/netns"
	"github.com/phasegate/phasegate/network/slot"
)

// outside6 is a test's IPv6 "outside network": a namespace behind a veth
// from the host, with an address in a global-looking prefix (3fff::/20,
// documentation since RFC 9637, which no default denies) and one in a
// unique local one (fc00::/7, which the always-denied set holds). The
// host's connected routes take traffic for both into the namespace alone.
type outside6 struct {
	global, local netip.Addr
}

func newOutside6(t *testing.T, cfg slot.Config) outside6 {
	t.Helper()
	path, err := netns.Create(context.Background(), cfg.NetnsDir, cfg.Prefix+"out")
	if err != nil {
		t.Fatal(err)
	}
	fd, err := netns.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	hostIf := cfg.HostIfPrefix() + "0" // no slot's (index 0), swept with the test's links
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: hostIf}, PeerName: "eth0", PeerNamespace: netlink.NsFd(fd)}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netlink.LinkDel(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: hostIf}}) })
	global := netip.MustParsePrefix(fmt.Sprintf("3fff:%x:%x::/64", rand.IntN(0xfff), rand.IntN(1<<16)))
	local := randomULA()
	host, err := netlink.LinkByName(hostIf)
	if err != nil {
		t.Fatal(err)
	}
	h, _ := handleIn(t, path)
	peer, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	for _, net6 := range []netip.Prefix{global, local} {
		for _, end := range []struct {
			add  func(netlink.Link, *netlink.Addr) error
			link netlink.Link
			n    int
		}{{netlink.AddrAdd, host, 1}, {h.AddrAdd, peer, 2}} {
			a := net6.Addr()
			for range end.n {
				a = a.Next()
			}
			if err := end.add(end.link, &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(64, 128)}, Flags: unix.IFA_F_NODAD}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, up := range []error{netlink.LinkSetUp(host), h.LinkSetUp(peer)} {
		if up != nil {
			t.Fatal(up)
		}
	}
	return outside6{global: global.Addr().Next().Next(), local: local.Addr().Next().Next()}
}

// A lease's egress policy holds for IPv6 as for IPv4, on the host: with
// no policy a slot reaches the outside; a policy drops what it denies and
// the always-denied set's IPv6 ranges (unique local here) unless it
// allows them, and DenyAll drops everything.
func TestDualStackEgressPolicy(t *testing.T) {
	setHost(t, []sysctl{{"net.ipv6.conf.all.forwarding", "1"}})
	env := nettest.New(t, 2)
	env.Config.CIDR6 = randomULA()
	out := newOutside6(t, env.Config)
	m, err := slot.NewManager(context.Background(), env.Config, slot.Options{Egress: egress.Defaults{AlwaysDeny: egress.DefaultAlwaysDeny}})
	if err != nil {
		t.Fatal(err)
	}
	s, err := m.Create(context.Background(), 1)
	if err != nil {
		t.Fatal(err)
	}
	outNS := env.Config.NetnsDir + "/" + env.Config.Prefix + "out"
	global := serveAt(t, outNS, netip.AddrPortFrom(out.global, 7700))
	local := serveAt(t, outNS, netip.AddrPortFrom(out.local, 7700))
	p := func(allow, deny []string, denyAll bool) *egress.Policy {
		pol, err := egress.Parse(allow, deny, denyAll, false)
		if err != nil {
			t.Fatal(err)
		}
		return &pol
	}
	net64 := func(a netip.Addr) string { return netip.PrefixFrom(a, 64).Masked().String() }
	for _, tc := range []struct {
		name                  string
		policy                *egress.Policy
		wantGlobal, wantLocal bool
	}{
		{"no policy", nil, true, true},
		{"empty policy: the always-denied unique local range", p(nil, nil, false), true, false},
		{"deny the global /64", p(nil, []string{net64(out.global)}, false), false, false},
		{"allow wins over deny and the always-denied", p([]string{out.global.String(), net64(out.local)}, []string{net64(out.global)}, false), true, true},
		{"deny all", p([]string{net64(out.local)}, nil, true), false, false},
	} {
		if tc.policy == nil {
			err = m.ClearEgress(context.Background(), s)
		} else {
			err = m.ApplyEgress(context.Background(), s, *tc.policy)
		}
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		for _, c := range []struct {
			at   netip.AddrPort
			want bool
		}{{global, tc.wantGlobal}, {local, tc.wantLocal}} {
			wait := refusedAfter
			if c.want {
				wait = reachWithin
			}
			err := in(t, s, func() error { return dialWithin(c.at, wait) })
			if (err == nil) != c.want {
				t.Errorf("%s: slot to %s: %v, want reached %t", tc.name, c.at, err, c.want)
			}
		}
	}
	if st, err := m.InspectEgress(context.Background(), s); err != nil || st.Drops == 0 {
		t.Errorf("InspectEgress = %+v, %v; want the deny-all drops counted", st, err)
	}
	if dr, err := m.Firewall().Drops(context.Background()); err != nil || dr.Spoofed != 0 {
		t.Errorf("Drops = %+v, %v: a slot's own traffic counted as spoofed", dr, err)
	}
}
