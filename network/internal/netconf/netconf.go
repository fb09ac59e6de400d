// Package netconf reads and sets a link's IPv4 settings and IPv6 address
// generation through rtnetlink, not /proc/sys.
//
// Only IPv6 turned off on a link of the root namespace (QuietIPv6), which
// no attribute sets, is a /proc/sys write.
//
// /proc/sys keeps one entry per network namespace for each per-namespace
// file, under one parent, and a lookup compares them one by one: with
// thousands of slots, opening net/ipv4/ip_forward inside one of them walks
// thousands of entries (docs/DESIGN.md §8). RTM_GETNETCONF and RTM_SETLINK
// cost the same with one namespace or ten thousand.
package netconf

import (
	"errors"
	"fmt"

	mnl "github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Interface indices that name a namespace's defaults rather than a link.
const (
	// IndexAll is net.ipv4.conf.all (net.ipv4.ip_forward is its
	// forwarding).
	IndexAll int32 = -1 // NETCONFA_IFINDEX_ALL
	// IndexDefault is net.ipv4.conf.default, which a new link copies.
	IndexDefault int32 = -2 // NETCONFA_IFINDEX_DEFAULT
)

// Attributes of linux/netconf.h, linux/if_link.h and linux/ip.h.
const (
	netconfaIfindex    = 1 // NETCONFA_IFINDEX
	netconfaForwarding = 2 // NETCONFA_FORWARDING
	iflaAfSpec         = 26
	iflaInetConf       = 1 // IFLA_INET_CONF
)

// Dial opens an rtnetlink connection in the namespace whose descriptor is
// nsfd (0: the caller's).
func Dial(nsfd int) (*mnl.Conn, error) {
	c, err := mnl.Dial(unix.NETLINK_ROUTE, &mnl.Config{NetNS: nsfd})
	if err != nil {
		return nil, fmt.Errorf("netconf: dial rtnetlink: %w", err)
	}
	return c, nil
}

// Forwarding reports whether IPv4 forwarding is on for the link ifindex of
// c's namespace, or for IndexAll or IndexDefault.
func Forwarding(c *mnl.Conn, ifindex int32) (bool, error) {
	return forwarding(c, unix.AF_INET, ifindex)
}

// Forwarding6 is Forwarding of IPv6 (net.ipv6.conf.<link>.forwarding;
// IndexAll's decides whether the kernel forwards IPv6 at all).
func Forwarding6(c *mnl.Conn, ifindex int32) (bool, error) {
	return forwarding(c, unix.AF_INET6, ifindex)
}

// forwarding is Forwarding of the address family family.
func forwarding(c *mnl.Conn, family byte, ifindex int32) (bool, error) {
	ae := mnl.NewAttributeEncoder()
	ae.Int32(netconfaIfindex, ifindex)
	attrs, err := ae.Encode()
	if err != nil {
		return false, err
	}
	msgs, err := c.Execute(mnl.Message{
		Header: mnl.Header{Type: unix.RTM_GETNETCONF, Flags: mnl.Request},
		Data:   append([]byte{family, 0, 0, 0}, attrs...), // struct netconfmsg, padded
	})
	if err != nil {
		return false, fmt.Errorf("netconf: RTM_GETNETCONF of index %d: %w", ifindex, err)
	}
	for _, m := range msgs {
		if len(m.Data) < 4 {
			continue
		}
		ad, err := mnl.NewAttributeDecoder(m.Data[4:])
		if err != nil {
			return false, fmt.Errorf("netconf: RTM_GETNETCONF of index %d: %w", ifindex, err)
		}
		for ad.Next() {
			if ad.Type() == netconfaForwarding {
				return ad.Uint32() != 0, nil
			}
		}
	}
	return false, fmt.Errorf("netconf: RTM_GETNETCONF of index %d: %w", ifindex, errNoForwarding)
}

var errNoForwarding = errors.New("no NETCONFA_FORWARDING in the answer")

// SetForwarding turns IPv4 forwarding on or off for the link ifindex of c's
// namespace (its net.ipv4.conf.<link>.forwarding). The kernel decides
// whether to forward a packet by the link it came in on, so a namespace
// that routes between two links needs it on both, and not the
// namespace's ip_forward.
func SetForwarding(c *mnl.Conn, ifindex int32, on bool) error {
	v := uint32(0)
	if on {
		v = 1
	}
	if err := SetLink(c, ifindex, []Value{{Conf: ConfForwarding, Value: v}}, false); err != nil {
		return fmt.Errorf("forwarding=%d: %w", v, err)
	}
	return nil
}
