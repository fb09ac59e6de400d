package slot

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/phasegate/phasegate/network"
)

// IPv6 reports whether the slots are dual-stack (Config.CIDR6 is set).
func (c Config) IPv6() bool { return c.CIDR6.IsValid() }

// validate6 checks CIDR6, when set: an IPv6 prefix (not an IPv4-mapped
// one) without host bits, with room for a /127 per slot.
func (c Config) validate6() error {
	if !c.IPv6() {
		return nil
	}
	bad := func(format string, a ...any) error {
		return &network.SettingError{Setting: "CIDR6", Problem: fmt.Sprintf(format, a...)}
	}
	switch p := c.CIDR6; {
	case !p.Addr().Is6() || p.Addr().Is4In6():
		return bad("%s is not an IPv6 network", p)
	case p.Masked() != p:
		return bad("%s has host bits set (want %s)", p, p.Masked())
	case p.Bits() > 127:
		return bad("%s is too small for one /127", p)
	case p.Bits() < 127 && p.Bits() > 96 && c.Slots > 1<<(127-p.Bits()):
		return bad("%s holds %d /127s, %d slots need as many", p, 1<<(127-p.Bits()), c.Slots)
	case p.Bits() == 127 && c.Slots > 1:
		return bad("%s holds one /127, %d slots need as many", p, c.Slots)
	}
	return nil
}

// Addrs6 returns slot i's /127 out of CIDR6, as Addrs does its /31: the
// host end's address (even) and the inside address (odd). Zero prefixes
// when CIDR6 is unset.
func (c Config) Addrs6(i int) (host, inside netip.Prefix) {
	if !c.IPv6() {
		return netip.Prefix{}, netip.Prefix{}
	}
	b := c.CIDR6.Addr().As16()
	hi, lo := binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])
	lo2 := lo + 2*uint64(i-1)
	if lo2 < lo {
		hi++
	}
	binary.BigEndian.PutUint64(b[:8], hi)
	binary.BigEndian.PutUint64(b[8:], lo2)
	h := netip.AddrFrom16(b)
	return netip.PrefixFrom(h, 127), netip.PrefixFrom(h.Next(), 127)
}
