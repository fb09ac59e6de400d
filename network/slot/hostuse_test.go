package slot

import (
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	vns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// inFreshNetns runs f on a thread of its own in a new network namespace,
// which plays the host: nothing is added to the real host's interfaces.
// The thread is never unlocked, so it exits with the namespace.
func inFreshNetns(t *testing.T, f func()) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces)")
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		ns, err := vns.New()
		if err != nil {
			t.Errorf("new netns: %v", err)
			return
		}
		defer ns.Close()
		f()
	}()
	<-done
}

func TestForeignUses(t *testing.T) {
	c := Config{Prefix: "fu-", NetnsDir: "/run/netns", Slots: 8, CIDR: netip.MustParsePrefix("10.90.0.0/24")}
	for _, tc := range []struct {
		name string
		link string
		addr string
		want []string
	}{
		{"own slot", "fu-h1", "10.90.0.0/31", nil},
		{"own slot, an alias label", "fu-h1", "10.90.0.0/31 fu-h1:a", nil},
		{"a host interface labelled like a slot", "uplink0", "10.90.0.200/24 fu-h1", []string{"address 10.90.0.200/24 dev uplink0", "route 10.90.0.0/24 dev uplink0"}},
		{"own slot beyond --slots", "fu-h40", "10.90.0.78/31", nil},
		{"another daemon's slot", "xx-h1", "10.90.0.0/31", []string{"address 10.90.0.0/31 dev xx-h1", "route 10.90.0.0/31 dev xx-h1"}},
		{"a host interface", "uplink0", "10.90.0.200/24", []string{"address 10.90.0.200/24 dev uplink0", "route 10.90.0.0/24 dev uplink0"}},
		{"a host interface around it", "uplink0", "10.90.7.1/16", []string{"address 10.90.7.1/16 dev uplink0", "route 10.90.0.0/16 dev uplink0"}},
		{"a host interface beside it", "uplink0", "10.91.0.1/24", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inFreshNetns(t, func() {
				l := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: tc.link}, PeerName: "peer0"}
				if err := netlink.LinkAdd(l); err != nil {
					t.Errorf("add %s: %v", tc.link, err)
					return
				}
				a, label, _ := strings.Cut(tc.addr, " ")
				p := netip.MustParsePrefix(a)
				if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: ipNet(p), Label: label}); err != nil {
					t.Errorf("address %s: %v", p, err)
					return
				}
				if err := netlink.LinkSetUp(l); err != nil {
					t.Errorf("up: %v", err)
					return
				}
				uses, err := c.ForeignUses()
				if err != nil {
					t.Errorf("ForeignUses: %v", err)
					return
				}
				var got []string
				for _, u := range uses {
					if u.Table == 255 {
						continue // the local table's entries for the same address
					}
					got = append(got, u.String())
				}
				if !slices.Equal(got, tc.want) {
					t.Errorf("ForeignUses = %q, want %q", got, tc.want)
				}
			})
		})
	}
}

// Routes are found in every table (one beyond 255, which only RTA_TABLE
// carries), with or without a device, and skipped on the daemon's own
// links whatever their table; the default route is never a use.
func TestForeignUsesRoutes(t *testing.T) {
	c := Config{Prefix: "fu-", NetnsDir: "/run/netns", Slots: 8, CIDR: netip.MustParsePrefix("10.90.0.0/24")}
	// t.Fatal is not for the namespace's goroutine: each step says
	// what failed and the test stops there.
	inFreshNetns(t, func() {
		add := func(name, peer string) netlink.Link {
			l := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: peer}
			if err := netlink.LinkAdd(l); err != nil {
				t.Errorf("add %s: %v", name, err)
				return nil
			}
			if err := netlink.LinkSetUp(l); err != nil {
				t.Errorf("up %s: %v", name, err)
				return nil
			}
			return l
		}
		own, up := add("fu-h2", "peer0"), add("uplink0", "peer1")
		if own == nil || up == nil {
			return
		}
		if err := netlink.AddrAdd(up, &netlink.Addr{IPNet: ipNet(netip.MustParsePrefix("192.0.2.1/24"))}); err != nil {
			t.Errorf("address: %v", err)
			return
		}
		for _, r := range []*netlink.Route{
			{LinkIndex: own.Attrs().Index, Dst: ipNet(netip.MustParsePrefix("10.90.0.8/31")), Table: 100},
			{LinkIndex: up.Attrs().Index, Dst: ipNet(netip.MustParsePrefix("10.90.0.16/28")), Table: 1000},
			{Dst: ipNet(netip.MustParsePrefix("10.90.0.64/26")), Type: unix.RTN_BLACKHOLE},
			{LinkIndex: up.Attrs().Index, Gw: netip.MustParseAddr("192.0.2.2").AsSlice()},
		} {
			if err := netlink.RouteAdd(r); err != nil {
				t.Errorf("route %v: %v", r, err)
				return
			}
		}
		uses, err := c.ForeignUses()
		if err != nil {
			t.Errorf("ForeignUses: %v", err)
			return
		}
		var got []string
		for _, u := range uses {
			got = append(got, u.String())
		}
		want := []string{"route 10.90.0.16/28 dev uplink0 table 1000", "route 10.90.0.64/26"}
		if !slices.Equal(got, want) {
			t.Errorf("ForeignUses = %q, want %q", got, want)
		}
	})
}

// A slot's /31 that the host routes already (another daemon's slot) is
// found before the slot is made, so Create never duplicates the route; a
// default route is no such route.
func TestRoutedAlready(t *testing.T) {
	p := netip.MustParsePrefix("10.90.0.4/31")
	inFreshNetns(t, func() {
		l := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "up0"}, PeerName: "peer0"}
		if err := netlink.LinkAdd(l); err != nil {
			t.Errorf("add: %v", err)
			return
		}
		if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: ipNet(netip.MustParsePrefix("192.0.2.1/24"))}); err != nil {
			t.Errorf("address: %v", err)
			return
		}
		if err := netlink.LinkSetUp(l); err != nil {
			t.Errorf("up: %v", err)
			return
		}
		if err := netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: netip.MustParseAddr("192.0.2.2").AsSlice(), Flags: int(netlink.FLAG_ONLINK)}); err != nil {
			t.Errorf("default route: %v", err)
			return
		}
		if r, err := routedAlready(p); err != nil || r != nil {
			t.Errorf("with only a default route: %v, %v; want none", r, err)
		}
		other := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "xx-h3"}, PeerName: "peer1"}
		if err := netlink.LinkAdd(other); err != nil {
			t.Errorf("add: %v", err)
			return
		}
		if err := netlink.AddrAdd(other, &netlink.Addr{IPNet: ipNet(p)}); err != nil {
			t.Errorf("address: %v", err)
			return
		}
		if err := netlink.LinkSetUp(other); err != nil {
			t.Errorf("up: %v", err)
			return
		}
		r, err := routedAlready(p)
		if err != nil || r == nil || r.Dev != "xx-h3" {
			t.Errorf("with another daemon's slot there: %v, %v; want its route", r, err)
		}
	})
}

// ReadHost reads the slot CIDR's and the guest network's uses in one walk:
// each range gets what overlaps it, and only that; without a guest device
// the guest's list is empty whatever the host has.
func TestReadHostRanges(t *testing.T) {
	guest := Guest{Tap: "tap0", Addr: netip.MustParsePrefix("10.77.0.21/30"), Gateway: netip.MustParseAddr("10.77.0.22")}
	slots := netip.MustParsePrefix("10.90.0.0/24")
	for _, tc := range []struct {
		name         string
		guest        Guest
		addrs        []string
		wantSlots    []string
		wantGuest    []string
		wantNoGuests bool
	}{
		{"nothing in either", guest, []string{"10.91.0.1/24"}, nil, nil, false},
		{"in the slot CIDR only", guest, []string{"10.90.0.200/24"},
			[]string{"address 10.90.0.200/24 dev uplink0", "route 10.90.0.0/24 dev uplink0"}, nil, false},
		{"in the guest network only", guest, []string{"10.77.0.21/30"},
			nil, []string{"address 10.77.0.21/30 dev uplink0", "route 10.77.0.20/30 dev uplink0"}, false},
		{"in both", guest, []string{"10.90.0.200/24", "10.77.0.1/24"},
			[]string{"address 10.90.0.200/24 dev uplink0", "route 10.90.0.0/24 dev uplink0"},
			[]string{"address 10.77.0.1/24 dev uplink0", "route 10.77.0.0/24 dev uplink0"}, false},
		{"no guest device", Guest{}, []string{"10.77.0.21/30"}, nil, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Config{Prefix: "fu-", NetnsDir: "/run/netns", Slots: 8, CIDR: slots, Guest: tc.guest}
			inFreshNetns(t, func() {
				l := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "uplink0"}, PeerName: "peer0"}
				if err := netlink.LinkAdd(l); err != nil {
					t.Errorf("add uplink0: %v", err)
					return
				}
				for _, a := range tc.addrs {
					if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: ipNet(netip.MustParsePrefix(a))}); err != nil {
						t.Errorf("address %s: %v", a, err)
						return
					}
				}
				if err := netlink.LinkSetUp(l); err != nil {
					t.Errorf("up: %v", err)
					return
				}
				r, err := c.ReadHost()
				if err != nil {
					t.Errorf("ReadHost: %v", err)
					return
				}
				if got := mainTable(r.Foreign); !slices.Equal(got, tc.wantSlots) {
					t.Errorf("slot CIDR's uses = %q, want %q", got, tc.wantSlots)
				}
				if got := mainTable(r.Guest); !slices.Equal(got, tc.wantGuest) {
					t.Errorf("guest network's uses = %q, want %q", got, tc.wantGuest)
				}
				if tc.wantNoGuests && r.Guest != nil {
					t.Errorf("guest uses %v without a guest device", r.Guest)
				}
			})
		})
	}
}

// mainTable renders uses but the local table's (the kernel's entries for
// the same addresses).
func mainTable(uses []HostUse) []string {
	var out []string
	for _, u := range uses {
		if u.Table != unix.RT_TABLE_LOCAL {
			out = append(out, u.String())
		}
	}
	return out
}

// HostAddrs gives every IPv4 address of the host as its /32 (the local
// end of a point-to-point address, a secondary address, loopback), and
// none in the slot CIDR, on the daemon's own links or any other: the
// CIDR is denied whole. ReadHost gives the same addresses from the host
// check's dumps, beside what the check finds.
func TestHostAddrs(t *testing.T) {
	c := Config{Prefix: "fu-", NetnsDir: "/run/netns", Slots: 8, CIDR: netip.MustParsePrefix("10.90.0.0/24")}
	inFreshNetns(t, func() {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			t.Errorf("lo: %v", err)
			return
		}
		if err := netlink.LinkSetUp(lo); err != nil {
			t.Errorf("lo up: %v", err)
			return
		}
		for _, tc := range []struct{ link, addr, peer string }{
			{"fu-h1", "10.90.0.0/31", ""},
			{"xx-h1", "10.90.0.2/31", ""},
			{"uplink0", "192.0.2.1/24", ""},
			{"uplink0", "198.51.100.7/32", ""},
			{"ptp0", "203.0.113.1/32", "203.0.113.9/32"},
		} {
			l, err := netlink.LinkByName(tc.link)
			if err != nil {
				v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: tc.link}, PeerName: tc.link + "p"}
				if err := netlink.LinkAdd(v); err != nil {
					t.Errorf("add %s: %v", tc.link, err)
					return
				}
				l = v
			}
			a := &netlink.Addr{IPNet: ipNet(netip.MustParsePrefix(tc.addr))}
			if tc.peer != "" {
				a.Peer = ipNet(netip.MustParsePrefix(tc.peer))
			}
			if err := netlink.AddrAdd(l, a); err != nil {
				t.Errorf("address %s on %s: %v", tc.addr, tc.link, err)
				return
			}
		}
		want := []string{"127.0.0.1/32", "192.0.2.1/32", "198.51.100.7/32", "203.0.113.1/32"}
		sorted := func(ps []netip.Prefix) []string {
			var s []string
			for _, p := range ps {
				s = append(s, p.String())
			}
			slices.Sort(s)
			return s
		}
		addrs, err := c.HostAddrs()
		if got := sorted(addrs); err != nil || !slices.Equal(got, want) {
			t.Errorf("HostAddrs = %q, %v; want %q", got, err, want)
		}
		r, err := c.ReadHost()
		if got := sorted(r.Addrs); err != nil || !slices.Equal(got, want) {
			t.Errorf("ReadHost: Addrs = %q, %v; want %q", got, err, want)
		}
		var foreign []string
		for _, u := range r.Foreign {
			if u.Table != 255 { // the local table's entry for the same address
				foreign = append(foreign, u.String())
			}
		}
		// The links are down: no prefix routes.
		if wantForeign := []string{"address 10.90.0.2/31 dev xx-h1"}; !slices.Equal(foreign, wantForeign) {
			t.Errorf("ReadHost: Foreign = %q, want %q", foreign, wantForeign)
		}
	})
}
