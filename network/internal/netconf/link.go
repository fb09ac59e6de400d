package netconf

import (
	"encoding/binary"
	"fmt"

	mnl "github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Conf names one of a link's IPv4 settings, its net.ipv4.conf.<link>.<name>
// (IPV4_DEVCONF_*, linux/ip.h).
type Conf uint16

// The settings a slot sets (docs/DESIGN.md §5 and §8 say how each link's
// value combines with the namespace's "all").
const (
	ConfForwarding        Conf = 1
	ConfProxyARP          Conf = 3
	ConfAcceptRedirects   Conf = 4
	ConfSecureRedirects   Conf = 5
	ConfSendRedirects     Conf = 6
	ConfRPFilter          Conf = 8
	ConfAcceptSourceRoute Conf = 9
	ConfBootpRelay        Conf = 10
	ConfARPAnnounce       Conf = 18
	ConfARPIgnore         Conf = 19
	ConfAcceptLocal       Conf = 23
	ConfRouteLocalnet     Conf = 26
)

// Value is one IPv4 setting of a link and what it is set to.
type Value struct {
	Conf  Conf
	Value uint32
}

// Attributes of linux/if_link.h for IPv6 (IFLA_INET6_*).
const (
	iflaInet6AddrGenMode = 8 // IFLA_INET6_ADDR_GEN_MODE
	// AddrGenNone is IN6_ADDR_GEN_MODE_NONE: a link that makes no IPv6
	// address of its own, link-local included.
	AddrGenNone = 1
)

// SetLink sets the IPv4 settings vals of the link ifindex of c's namespace
// and, with noIPv6Addr, its IPv6 address generation to none (which takes
// effect when the link comes up), in one RTM_SETLINK. The kernel writes
// each value as given, with none of the side effects a /proc/sys write
// of "all" has (it changes nothing else).
func SetLink(c *mnl.Conn, ifindex int32, vals []Value, noIPv6Addr bool) error {
	return setLink(c, ifindex, "", vals, noIPv6Addr)
}

// SetLinkNamed is SetLink of the link called name (the kernel finds it by
// IFLA_IFNAME): no lookup of its index first, which costs a dump or a
// namespace switch of its own. A missing link is ENODEV.
func SetLinkNamed(c *mnl.Conn, name string, vals []Value) error {
	return setLink(c, 0, name, vals, false)
}

// setLink is SetLink and SetLinkNamed: the link ifindex, or name when it
// is not "".
func setLink(c *mnl.Conn, ifindex int32, name string, vals []Value, noIPv6Addr bool) error {
	ae := mnl.NewAttributeEncoder()
	if name != "" {
		ae.String(unix.IFLA_IFNAME, name)
	}
	ae.Nested(iflaAfSpec, func(ae *mnl.AttributeEncoder) error {
		if len(vals) > 0 {
			ae.Nested(unix.AF_INET, func(ae *mnl.AttributeEncoder) error {
				ae.Nested(iflaInetConf, func(ae *mnl.AttributeEncoder) error {
					for _, v := range vals {
						ae.Uint32(uint16(v.Conf), v.Value)
					}
					return nil
				})
				return nil
			})
		}
		if noIPv6Addr {
			ae.Nested(unix.AF_INET6, func(ae *mnl.AttributeEncoder) error {
				ae.Uint8(iflaInet6AddrGenMode, AddrGenNone)
				return nil
			})
		}
		return nil
	})
	attrs, err := ae.Encode()
	if err != nil {
		return err
	}
	if _, err := c.Execute(mnl.Message{
		Header: mnl.Header{Type: unix.RTM_SETLINK, Flags: mnl.Request | mnl.Acknowledge},
		Data:   append(ifinfomsg(ifindex), attrs...),
	}); err != nil {
		if name != "" {
			return fmt.Errorf("netconf: RTM_SETLINK of %s's settings: %w", name, err)
		}
		return fmt.Errorf("netconf: RTM_SETLINK of link %d's settings: %w", ifindex, err)
	}
	return nil
}

// LinkConf is what Link read of one link.
type LinkConf struct {
	// IPv4 is the link's IPv4 settings, indexed by Conf (index 0 unused).
	IPv4 []uint32
	// AddrGenMode is the link's IPv6 address generation mode, -1 when the
	// link has no IPv6 (a kernel without it, IPv6 disabled).
	AddrGenMode int
}

// Get returns setting k, 0 for one the kernel did not report.
func (l LinkConf) Get(k Conf) uint32 {
	if int(k) < len(l.IPv4) {
		return l.IPv4[k]
	}
	return 0
}

// Link reads the IPv4 settings and the IPv6 address generation mode of
// the link ifindex of c's namespace: one RTM_GETLINK of that link.
func Link(c *mnl.Conn, ifindex int32) (LinkConf, error) {
	out := LinkConf{AddrGenMode: -1}
	msgs, err := c.Execute(mnl.Message{
		Header: mnl.Header{Type: unix.RTM_GETLINK, Flags: mnl.Request},
		Data:   ifinfomsg(ifindex),
	})
	if err != nil {
		return out, fmt.Errorf("netconf: RTM_GETLINK of link %d: %w", ifindex, err)
	}
	for _, m := range msgs {
		if len(m.Data) < unix.SizeofIfInfomsg {
			continue
		}
		ad, err := mnl.NewAttributeDecoder(m.Data[unix.SizeofIfInfomsg:])
		if err != nil {
			return out, fmt.Errorf("netconf: RTM_GETLINK of link %d: %w", ifindex, err)
		}
		for ad.Next() {
			if ad.Type() == iflaAfSpec {
				ad.Nested(func(ad *mnl.AttributeDecoder) error { return afSpec(ad, &out) })
			}
		}
		if err := ad.Err(); err != nil {
			return out, fmt.Errorf("netconf: RTM_GETLINK of link %d: %w", ifindex, err)
		}
	}
	return out, nil
}

// afSpec reads IFLA_AF_SPEC's IPv4 settings and IPv6 mode into out.
func afSpec(ad *mnl.AttributeDecoder, out *LinkConf) error {
	for ad.Next() {
		switch ad.Type() {
		case unix.AF_INET:
			ad.Nested(func(ad *mnl.AttributeDecoder) error {
				for ad.Next() {
					if ad.Type() == iflaInetConf {
						b := ad.Bytes()
						out.IPv4 = make([]uint32, 1, 1+len(b)/4)
						for i := 0; i+4 <= len(b); i += 4 {
							out.IPv4 = append(out.IPv4, binary.NativeEndian.Uint32(b[i:]))
						}
					}
				}
				return nil
			})
		case unix.AF_INET6:
			ad.Nested(func(ad *mnl.AttributeDecoder) error {
				for ad.Next() {
					if ad.Type() == iflaInet6AddrGenMode {
						out.AddrGenMode = int(ad.Uint8())
					}
				}
				return nil
			})
		}
	}
	return nil
}

// ifinfomsg is a struct ifinfomsg of family AF_UNSPEC for the link ifindex.
func ifinfomsg(ifindex int32) []byte {
	ifi := make([]byte, unix.SizeofIfInfomsg)
	binary.NativeEndian.PutUint32(ifi[4:8], uint32(ifindex))
	return ifi
}
