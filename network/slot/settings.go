package slot

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"

	mnl "github.com/mdlayher/netlink"
	"github.com/vishvananda/netlink"
	vns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/network/internal/netconf"
	"github.com/phasegate/phasegate/network/netns"
)

// A new network namespace copies the IPv4 settings of the host's
// ("all", "default", and through "default" every link's: with
// net.core.devconf_inherit_init_net at 0, the kernel's default), so a slot
// made on a host that forwards would forward, and one made on a host
// without reverse-path filtering would not filter. So every link the
// daemon makes inside a slot is given its own values (insideConf), through
// rtnetlink; IPv6 is off inside (no address made on eth0, none on lo); and
// the few namespace-wide values that a link's own cannot override are
// written where the host's would weaken them (allWrites). docs/DESIGN.md
// §5 ("The slot's own settings") says which and why, and §8 what each
// costs.

// insideConf is the IPv4 settings of each link the daemon makes inside a
// slot (lo, eth0, a guest's tap): forwarding only where the slot routes
// (forward: a guest slot's tap and uplink), strict reverse-path filtering,
// no redirects sent or taken, no source routing, ARP answered only for
// the link's own address and sent from it, no proxy ARP, no local or
// loopback addresses taken from outside.
func insideConf(forward bool) []netconf.Value {
	f := uint32(0)
	if forward {
		f = 1
	}
	return []netconf.Value{
		{Conf: netconf.ConfForwarding, Value: f},
		{Conf: netconf.ConfRPFilter, Value: 1},
		{Conf: netconf.ConfAcceptRedirects, Value: 0},
		{Conf: netconf.ConfSecureRedirects, Value: 0},
		{Conf: netconf.ConfSendRedirects, Value: 0},
		{Conf: netconf.ConfAcceptSourceRoute, Value: 0},
		{Conf: netconf.ConfARPIgnore, Value: 1},
		{Conf: netconf.ConfARPAnnounce, Value: 2},
		{Conf: netconf.ConfProxyARP, Value: 0},
		{Conf: netconf.ConfAcceptLocal, Value: 0},
		{Conf: netconf.ConfRouteLocalnet, Value: 0},
		{Conf: netconf.ConfBootpRelay, Value: 0},
	}
}

// hostEndConf is the IPv4 settings of a slot's host end: no redirect
// taken from the slot or sent to it, no source route honoured. Its
// forwarding is the host's (the slots' egress needs it on) and its
// reverse-path test is the slot table's antispoof chain.
var hostEndConf = []netconf.Value{
	{Conf: netconf.ConfAcceptRedirects, Value: 0},
	{Conf: netconf.ConfSendRedirects, Value: 0},
	{Conf: netconf.ConfAcceptSourceRoute, Value: 0},
}

// sysctlWrite is one namespace-wide value written inside each new slot.
type sysctlWrite struct{ path, value string }

// allRule is a namespace-wide IPv4 value ("all") whose link values the
// kernel combines with it so that the link's own cannot override it
// (linux/inetdevice.h: rp_filter and arp_ignore take the larger, the
// others either), and the value a slot needs when the host's is worse.
type allRule struct {
	name string
	bad  func(v int) bool
	want string
}

var allRules = []allRule{
	{"rp_filter", func(v int) bool { return v > 1 }, "1"},       // 2 is loose
	{"arp_ignore", func(v int) bool { return v > 2 }, "1"},      // 3.. answer less than for the link's own address, 8 nothing
	{"route_localnet", func(v int) bool { return v != 0 }, "0"}, // 127/8 from outside, a guest's to the slot's loopback
	{"proxy_arp", func(v int) bool { return v != 0 }, "0"},
	{"accept_local", func(v int) bool { return v != 0 }, "0"},
}

// allWrites reads the namespace-wide values a new namespace copies (the
// daemon's own namespace's, which is the host's) and returns those a slot
// must write over. With devconf_inherit_init_net at 2 a namespace starts
// from the kernel's defaults, which need none. A value that cannot be
// read is written.
func allWrites(sysctlRoot string) []sysctlWrite {
	if b, err := os.ReadFile(sysctlRoot + "/net/core/devconf_inherit_init_net"); err == nil && strings.TrimSpace(string(b)) == "2" {
		return nil
	}
	var out []sysctlWrite
	for _, r := range allRules {
		path := "/proc/sys/net/ipv4/conf/all/" + r.name
		b, err := os.ReadFile(sysctlRoot + "/net/ipv4/conf/all/" + r.name)
		if v, perr := strconv.Atoi(strings.TrimSpace(string(b))); err != nil || perr != nil || r.bad(v) {
			out = append(out, sysctlWrite{path, r.want})
		}
	}
	return out
}

// settleInside gives slot s's lo and eth0 (indices lo, in) their settings,
// eth0 no IPv6 address of its own (before it comes up), and writes the
// namespace-wide values m.allWrites names, in the namespace fd.
func (m *Manager) settleInside(fd int, s *Slot, lo, in int) error {
	c, err := netconf.Dial(fd)
	if err != nil {
		return fmt.Errorf("settings in %s: %w", s.NetnsName, err)
	}
	defer c.Close()
	if err := setLink(c, int32(lo), insideConf(false), false); err != nil {
		return fmt.Errorf("settings of lo in %s: %w", s.NetnsName, err)
	}
	if err := setLink(c, int32(in), insideConf(m.cfg.Guest.Enabled()), true); err != nil {
		return fmt.Errorf("settings of %s in %s: %w", s.InsideIf, s.NetnsName, err)
	}
	if len(m.allWrites) == 0 {
		return nil
	}
	// A /proc/sys write inside a namespace costs a lookup among every
	// namespace's entries (§8): only on a host whose values need it.
	if err := netns.Do(fd, func() error {
		for _, w := range m.allWrites {
			if err := os.WriteFile(w.path, []byte(w.value), 0); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("namespace-wide settings in %s: %w", s.NetnsName, err)
	}
	return nil
}

// setLink is netconf.SetLink, without the IPv6 part on a kernel that has
// no IPv6.
func setLink(c *mnl.Conn, link int32, vals []netconf.Value, noIPv6Addr bool) error {
	err := netconf.SetLink(c, link, vals, noIPv6Addr)
	if err != nil && noIPv6Addr && !ipv6Enabled() {
		err = netconf.SetLink(c, link, vals, false)
	}
	return err
}

// loopback6 is lo's IPv6 address, which the kernel gives lo when it comes
// up whatever its address generation mode.
var loopback6 = &netlink.Addr{IPNet: ipNet(netip.MustParsePrefix("::1/128"))}

// dropLoopback6 takes ::1 off lo (h a handle in the slot's namespace): no
// IPv6 inside, loopback included. Gone already, or no IPv6, is not an
// error.
func dropLoopback6(h *netlink.Handle, lo netlink.Link) error {
	err := h.AddrDel(lo, loopback6)
	if err == nil || errors.Is(err, unix.EADDRNOTAVAIL) || !ipv6Enabled() {
		return nil
	}
	return fmt.Errorf("take ::1 off lo: %w", err)
}

// RepairSettings checks the settings of slot s's own links (lo, eth0 and
// a guest's tap, as insideConf says) and that nothing inside has an IPv6
// address (but a dual-stack slot's own, and its default route, which
// must be there: repair6), puts back what differs, and returns what it repaired (nothing,
// for a slot as it was made). The namespace-wide values are written at
// creation only: reading one back costs what writing it does (§8).
func (m *Manager) RepairSettings(s *Slot) (repaired []string, err error) {
	err = withNetns(s, func(fd int) error {
		repaired, err = m.repairSettings(fd, s)
		return err
	})
	if err != nil {
		return repaired, fmt.Errorf("slot %d: settings: %w", s.Index, err)
	}
	return repaired, nil
}

func (m *Manager) repairSettings(fd int, s *Slot) ([]string, error) {
	h, err := netlink.NewHandleAt(vns.NsHandle(fd))
	if err != nil {
		return nil, fmt.Errorf("netlink handle in %s: %w", s.NetnsName, err)
	}
	defer h.Close()
	c, err := netconf.Dial(fd)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	type linkWant struct {
		name            string
		forward, noIPv6 bool
	}
	links := []linkWant{{"lo", false, false}, {s.InsideIf, m.cfg.Guest.Enabled(), true}}
	if m.cfg.Guest.Enabled() {
		links = append(links, linkWant{m.cfg.Guest.Tap, true, true})
	}
	var repaired []string
	for _, l := range links {
		link, err := h.LinkByName(l.name)
		if err != nil {
			if isNotFound(err) {
				continue // RepairGuest's, or the host's repair
			}
			return repaired, fmt.Errorf("find %s in %s: %w", l.name, s.NetnsName, err)
		}
		idx := int32(link.Attrs().Index)
		got, err := netconf.Link(c, idx)
		if err != nil {
			return repaired, err
		}
		want := insideConf(l.forward)
		if !confIs(got, want) || (l.noIPv6 && got.AddrGenMode >= 0 && got.AddrGenMode != netconf.AddrGenNone) {
			if err := setLink(c, idx, want, l.noIPv6); err != nil {
				return repaired, fmt.Errorf("settings of %s in %s: %w", l.name, s.NetnsName, err)
			}
			repaired = append(repaired, "settings of "+l.name)
		}
	}
	gone, err := dropIPv6(h, s)
	repaired = append(repaired, gone...)
	if err != nil {
		return repaired, err
	}
	back, err := repair6(h, s)
	return append(repaired, back...), err
}

// confIs reports whether got has every value of want.
func confIs(got netconf.LinkConf, want []netconf.Value) bool {
	for _, w := range want {
		if got.Get(w.Conf) != w.Value {
			return false
		}
	}
	return true
}

// dropIPv6 deletes every IPv6 address in the namespace of handle h but
// a dual-stack slot's own (keep6), and names them.
func dropIPv6(h *netlink.Handle, s *Slot) ([]string, error) {
	addrs, err := h.AddrList(nil, netlink.FAMILY_V6)
	if err != nil {
		if !ipv6Enabled() {
			return nil, nil
		}
		return nil, fmt.Errorf("IPv6 addresses: %w", err)
	}
	var gone []string
	for _, a := range addrs {
		link, err := h.LinkByIndex(a.LinkIndex)
		if err != nil {
			return gone, fmt.Errorf("link %d of %s: %w", a.LinkIndex, a.IPNet, err)
		}
		if keep6(s, link.Attrs().Name, a) {
			continue
		}
		if err := h.AddrDel(link, &a); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
			return gone, fmt.Errorf("take %s off %s: %w", a.IPNet, link.Attrs().Name, err)
		}
		gone = append(gone, "IPv6 address "+a.IPNet.String()+" on "+link.Attrs().Name)
	}
	return gone, nil
}

// settleHostEnd gives slot s's host end (name, index) its settings before
// it comes up: hostEndConf, and IPv6 off (quietIPv6) or, for a dual-stack
// slot (v6), on without a link-local address and deaf to router
// advertisements and redirects (hostEnd6).
func settleHostEnd(name string, index int, v6 bool) error {
	if v6 {
		if err := hostEnd6(name); err != nil {
			return err
		}
	} else if err := quietIPv6(name); err != nil {
		return err
	}
	c, err := netconf.Dial(0)
	if err != nil {
		return err
	}
	defer c.Close()
	if err := netconf.SetLink(c, int32(index), hostEndConf, v6); err != nil {
		return fmt.Errorf("settings of %s: %w", name, err)
	}
	return nil
}
