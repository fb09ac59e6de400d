package main

import (
	"flag"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"

	"github.com/phasegate/phasegate/phases"
)

// guestFlags registers the slot profile of microVM slots (the guest
// device in every slot) and the daemon's part of every egress policy.
func guestFlags(fs *flag.FlagSet, cfg *phases.Config) {
	fs.StringVar(&cfg.Slots.Guest.Tap, "slot-guest-tap", cfg.Slots.Guest.Tap, "name of a tap made inside every slot for a microVM guest, e.g. tap0 (none by default); needs --slot-guest-addr and --slot-guest-gateway")
	fs.Var(addrPrefixValue(&cfg.Slots.Guest.Addr), "slot-guest-addr", "the guest's address with its network's prefix length, the same in every slot, e.g. 169.254.0.21/30; NATed to each slot's inside address")
	fs.Var(addrValue(&cfg.Slots.Guest.Gateway), "slot-guest-gateway", "the tap's address, the guest's default gateway, e.g. 169.254.0.22")
	fs.Var(macValue(&cfg.Slots.Guest.MAC), "slot-guest-mac", "the guest's MAC, as its VM monitor sets it: the tap then accepts frames from it alone (default: any MAC; the guest's address is checked either way)")
	fs.Var(prefixesValue{&cfg.Egress.AlwaysAllow}, "slot-egress-allow", "CIDRs every egress policy accepts before anything else, comma-separated (none by default)")
	fs.Var(prefixesValue{&cfg.Egress.AlwaysDeny}, "slot-egress-deny", "CIDRs every egress policy drops unless it allows them, comma-separated (\"none\": no range); the slot CIDR and the host's own addresses are always added")
	fs.Var(port16Value{&cfg.Egress.ProxyPort}, "slot-egress-proxy-port", "TCP port of an egress proxy on the host, at each slot's gateway, that policies with redirect_tcp send new TCP connections to; must be in --slot-host-tcp-ports (0: none)")
}

// addrPrefixValue is an address with a prefix length (host bits kept).
func addrPrefixValue(p *netip.Prefix) parsedValue[netip.Prefix] {
	return parsedValue[netip.Prefix]{p: p, show: showValid[netip.Prefix], parse: parsing(netip.ParsePrefix, "an address with a prefix length")}
}

// macValue is an Ethernet MAC.
func macValue(m *net.HardwareAddr) parsedValue[net.HardwareAddr] {
	return parsedValue[net.HardwareAddr]{p: m, show: net.HardwareAddr.String, parse: func(s string) (net.HardwareAddr, error) {
		m, err := net.ParseMAC(s)
		if err != nil || len(m) != 6 {
			return nil, fmt.Errorf("not an Ethernet MAC: %q (want 02:fc:00:00:00:01)", s)
		}
		return m, nil
	}}
}

// addrValue is an IP address.
func addrValue(a *netip.Addr) parsedValue[netip.Addr] {
	return parsedValue[netip.Addr]{p: a, show: showValid[netip.Addr], parse: parsing(netip.ParseAddr, "an IP address")}
}

// prefixesValue is a comma-separated list of CIDRs; "none" is the empty
// list.
type prefixesValue struct{ p *[]netip.Prefix }

func (v prefixesValue) String() string {
	if v.p == nil {
		return ""
	}
	s := make([]string, len(*v.p))
	for i, p := range *v.p {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}

func (v prefixesValue) Set(s string) error {
	out := []netip.Prefix{}
	if strings.TrimSpace(s) == "none" {
		*v.p = out
		return nil
	}
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		var p netip.Prefix
		if err := prefixValue(&p).Set(f); err != nil {
			return err
		}
		out = append(out, p)
	}
	*v.p = out
	return nil
}

// port16Value is a TCP or UDP port, 0 for none.
type port16Value struct{ p *uint16 }

func (v port16Value) String() string {
	if v.p == nil {
		return "0"
	}
	return strconv.Itoa(int(*v.p))
}

func (v port16Value) Set(s string) error {
	n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 16)
	if err != nil {
		return fmt.Errorf("%q is not a port (0-65535)", s)
	}
	*v.p = uint16(n)
	return nil
}
