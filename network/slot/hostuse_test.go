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

// HostUses reads the slot CIDR's and the guest network's uses in one walk:
// each range gets what overlaps it, and only that; without a guest device
// the guest's list is empty whatever the host has.
func TestHostUses(t *testing.T) {
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
				su, gu, err := c.HostUses()
				if err != nil {
					t.Errorf("HostUses: %v", err)
					return
				}
				if got := mainTable(su); !slices.Equal(got, tc.wantSlots) {
					t.Errorf("slot CIDR's uses = %q, want %q", got, tc.wantSlots)
				}
				if got := mainTable(gu); !slices.Equal(got, tc.wantGuest) {
					t.Errorf("guest network's uses = %q, want %q", got, tc.wantGuest)
				}
				if tc.wantNoGuests && gu != nil {
					t.Errorf("guest uses %v without a guest device", gu)
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

// HostAddrs gives every host address outside the slot CIDR as its /32 and
// leaves out what the CIDR holds (the slots' gateways), whatever link it
// is on.
func TestHostAddrs(t *testing.T) {
	c := Config{Prefix: "fu-", NetnsDir: "/run/netns", Slots: 8, CIDR: netip.MustParsePrefix("10.90.0.0/24")}
	inFreshNetns(t, func() {
		for _, l := range []struct{ name, addr string }{
			{"fu-h1", "10.90.0.0/31"},    // a slot's gateway
			{"uplink0", "10.91.0.1/24"},  // the host's
			{"uplink0", "192.0.2.7/32"},  // the host's, a second one
			{"other0", "10.90.0.200/31"}, // in the CIDR on a foreign link: the CIDR covers it
		} {
			link, err := netlink.LinkByName(l.name)
			if err != nil {
				v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: l.name}, PeerName: l.name + "p"}
				if err := netlink.LinkAdd(v); err != nil {
					t.Errorf("add %s: %v", l.name, err)
					return
				}
				link = v
			}
			if err := netlink.AddrAdd(link, &netlink.Addr{IPNet: ipNet(netip.MustParsePrefix(l.addr))}); err != nil {
				t.Errorf("address %s on %s: %v", l.addr, l.name, err)
				return
			}
		}
		got, err := c.HostAddrs()
		if err != nil {
			t.Errorf("HostAddrs: %v", err)
			return
		}
		slices.SortFunc(got, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
		if want := []netip.Prefix{netip.MustParsePrefix("10.91.0.1/32"), netip.MustParsePrefix("192.0.2.7/32")}; !slices.Equal(got, want) {
			t.Errorf("HostAddrs = %v, want %v", got, want)
		}
	})
}
