package slot

import (
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/phasegate/phasegate/network"
	"github.com/phasegate/phasegate/network/netns"
	"github.com/phasegate/phasegate/network/nft"
)

// IFNAMSIZ-1: the longest interface name the kernel accepts.
const maxIfName = 15

// InsideIfName is the name of the slot's interface inside its namespace.
const InsideIfName = "eth0"

// Defaults used by DefaultConfig.
const (
	// DefaultPrefix starts every name the daemon makes.
	DefaultPrefix = "pg-"
	// DefaultNetnsDir is where iproute2 keeps named namespaces.
	DefaultNetnsDir = "/run/netns"
	// DefaultSlots is the default number of slot indices.
	DefaultSlots = 1024
)

// DefaultCIDR is the default slot network: a link-local /19 (4,096
// slots; DefaultConfig has 1,024), which no network routes beyond a
// link — a slot's veth is one — clear of what hosts and guests commonly
// use in 169.254.0.0/16: E2B's microVM guest network 169.254.0.20/30
// (E2BGuestRange), Kubernetes' node-local DNS 169.254.20.10, the cloud
// metadata, DNS and time services at 169.254.169.x, ECS's 169.254.170.2
// and EKS's 169.254.172.0/22. A host with a route for all of
// 169.254.0.0/16 (IPv4 link-local addressing on a LAN, as NetworkManager
// sets up on desktops) is refused at start, naming that route: give such
// a host another CIDR.
var DefaultCIDR = netip.MustParsePrefix("169.254.128.0/19")

// E2BGuestRange is the fixed network of E2B's microVM guests (guest
// 169.254.0.21, its tap 169.254.0.22), which every microVM slot repeats
// inside its own namespace: a slot CIDR must not hold it (see
// Config.GuestRanges).
var E2BGuestRange = netip.MustParsePrefix("169.254.0.20/30")

// metadataAddr is the cloud metadata address no slot may use.
var metadataAddr = netip.MustParseAddr("169.254.169.254")

// ErrInvalidConfig is wrapped by every error Config.Validate returns.
var ErrInvalidConfig = errors.New("invalid slot config")

// Config says where and how slots are made.
type Config struct {
	// Prefix starts every name: the netns <Prefix><i> and the host link
	// <Prefix>h<i>. Lowercase letters, digits and '-', starting with a
	// letter and not ending with a digit (so <Prefix><i> parses one way).
	Prefix string
	// NetnsDir is the absolute directory of the netns files.
	NetnsDir string
	// Slots is N: slot indices are 1..N.
	Slots int
	// CIDR is the IPv4 network the /31s are cut from; it must hold 2*N
	// addresses.
	CIDR netip.Prefix
	// CIDR6 is the optional IPv6 network each slot's /127 is cut from
	// (Addrs6), as its /31 is from CIDR; it must hold 2*N addresses.
	// Unset (the zero Prefix), IPv6 is off in every slot.
	CIDR6 netip.Prefix
	// Table overrides the nftables table name (default nft.TableName(Prefix)).
	Table string
	// GuestRanges are networks that workloads inside every slot use for
	// themselves (a microVM's guest network behind a tap, such as
	// E2BGuestRange): the same addresses in every slot, so none may lie in
	// CIDR, where an address means one slot on the host. Empty until
	// microVM slots give it a flag.
	GuestRanges []netip.Prefix
	// Guest is the optional guest device of every slot (a tap for a
	// microVM and its NAT); its network counts as one of GuestRanges.
	Guest Guest
}

// DefaultConfig returns the daemon's defaults.
func DefaultConfig() Config {
	return Config{Prefix: DefaultPrefix, NetnsDir: DefaultNetnsDir, Slots: DefaultSlots, CIDR: DefaultCIDR}
}

// Validate checks the configuration and returns every problem found, joined,
// each wrapping ErrInvalidConfig.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, a...)...))
	}
	switch {
	case c.Prefix == "":
		bad("prefix is empty")
	case !validPrefix(c.Prefix):
		bad("prefix %q: use lowercase letters, digits and '-', start with a letter, do not end with a digit", c.Prefix)
	}
	if c.Slots < 1 {
		bad("slots is %d, want at least 1", c.Slots)
	} else if c.Prefix != "" {
		if l := len(c.HostIfName(c.Slots)); l > maxIfName {
			bad("prefix %q is too long for %d slots: host interface %q is %d bytes, the kernel allows %d (IFNAMSIZ)",
				c.Prefix, c.Slots, c.HostIfName(c.Slots), l, maxIfName)
		}
	}
	switch {
	case c.NetnsDir == "":
		bad("netns dir is empty")
	case !filepath.IsAbs(c.NetnsDir):
		bad("netns dir %q is not absolute", c.NetnsDir)
	case filepath.Clean(c.NetnsDir) != c.NetnsDir:
		bad("netns dir %q is not clean (want %q)", c.NetnsDir, filepath.Clean(c.NetnsDir))
	}
	switch {
	case !c.CIDR.IsValid():
		bad("slot CIDR is not set")
	case !c.CIDR.Addr().Is4():
		bad("slot CIDR %s is not IPv4", c.CIDR)
	case c.CIDR.Masked() != c.CIDR:
		bad("slot CIDR %s has host bits set (want %s)", c.CIDR, c.CIDR.Masked())
	case c.Slots >= 1 && c.CIDR.Bits() > 31:
		bad("slot CIDR %s is too small for one /31", c.CIDR)
	case c.Slots > Capacity(c.CIDR):
		bad("slot CIDR %s holds %d addresses, %d slots need %d", c.CIDR,
			uint64(1)<<(32-c.CIDR.Bits()), c.Slots, 2*c.Slots)
	case c.Slots >= 1:
		if last := c.offset(c.Slots, 1); c.CIDR.Contains(metadataAddr) &&
			addrLE(c.CIDR.Addr(), metadataAddr) && addrLE(metadataAddr, last) {
			bad("slot CIDR %s with %d slots would use %s (cloud metadata)", c.CIDR, c.Slots, metadataAddr)
		}
	}
	if se := c.validate6(); se != nil {
		errs = append(errs, fmt.Errorf("%w: %w", ErrInvalidConfig, se))
	}
	for _, se := range c.Guest.validate() {
		errs = append(errs, fmt.Errorf("%w: %w", ErrInvalidConfig, se))
	}
	ranges := c.GuestRanges
	if c.Guest.Enabled() && c.Guest.Addr.IsValid() {
		ranges = append(slices.Clip(ranges), c.Guest.Range())
	}
	for _, g := range ranges {
		if c.CIDR.IsValid() && g.Overlaps(c.CIDR) {
			errs = append(errs, fmt.Errorf("%w: %w", ErrInvalidConfig, &network.SettingError{Setting: "CIDR", Problem: fmt.Sprintf(
				"%s overlaps the guest range %s that every slot's workload uses inside: give one clear of it (the default %s is)", c.CIDR, g, DefaultCIDR)}))
		}
	}
	if c.Table != "" && (len(c.Table) > 255 || strings.ContainsRune(c.Table, 0)) {
		bad("table name %q", c.Table)
	}
	return errors.Join(errs...)
}

func validPrefix(p string) bool {
	for i := 0; i < len(p); i++ {
		ch := p[i]
		if !(ch >= 'a' && ch <= 'z' || ch >= '0' && ch <= '9' || ch == '-') {
			return false
		}
	}
	return p[0] >= 'a' && p[0] <= 'z' && !(p[len(p)-1] >= '0' && p[len(p)-1] <= '9')
}

func addrLE(a, b netip.Addr) bool { return a.Compare(b) <= 0 }

// TableName is the nftables table of this configuration.
func (c Config) TableName() string {
	if c.Table != "" {
		return c.Table
	}
	return nft.TableName(c.Prefix)
}

// NetnsName is the netns file name of slot i.
func (c Config) NetnsName(i int) string { return c.Prefix + strconv.Itoa(i) }

// NetnsPath is the netns file path of slot i.
func (c Config) NetnsPath(i int) string { return filepath.Join(c.NetnsDir, c.NetnsName(i)) }

// HostIfPrefix starts the name of every slot's host link: the
// root-namespace end of its veth pair is HostIfPrefix and its index.
func (c Config) HostIfPrefix() string { return c.Prefix + "h" }

// HostIfName is the root-namespace end of slot i's veth pair.
func (c Config) HostIfName(i int) string { return c.HostIfPrefix() + strconv.Itoa(i) }

// ParkedIfName is the name slot i's warm host end takes while the slot is
// attached to a namespace it does not own ([Manager.Attach]): down, with
// no address, its peer still in the slot's own namespace, with which it
// goes. It is as long as [Config.HostIfName], so it fits wherever that
// does, and no prefix's host end or parked end bears it but this one's.
func (c Config) ParkedIfName(i int) string { return c.Prefix + "x" + strconv.Itoa(i) }

// ShaperIfPrefix starts the name of every slot's ifb, the device its
// traffic out is shaped on (package network/shape).
func (c Config) ShaperIfPrefix() string { return c.Prefix + "b" }

// ShaperIfName is slot i's ifb: as long as [Config.HostIfName], so it fits
// wherever that does.
func (c Config) ShaperIfName(i int) string { return c.ShaperIfPrefix() + strconv.Itoa(i) }

// CanonicalShaperIfIndex is CanonicalHostIfIndex for an ifb name
// <Prefix>b<i>.
func (c Config) CanonicalShaperIfIndex(name string) (int, bool) {
	s, ok := strings.CutPrefix(name, c.ShaperIfPrefix())
	if !ok {
		return 0, false
	}
	return parseIndex(s)
}

// Capacity is how many slots cidr holds, a /31 each: 128 in a /24, 0 in
// a /32 or a prefix that is not IPv4.
func Capacity(cidr netip.Prefix) int {
	if !cidr.IsValid() || !cidr.Addr().Is4() || cidr.Bits() > 31 {
		return 0
	}
	return 1 << (31 - cidr.Bits())
}

// MaxIndex is the largest index a slot name can carry: a /0 holds 2^31
// /31s, so no valid Config has more slots (2^31 itself is left out so that
// an index fits an int32 everywhere).
const MaxIndex = 1<<31 - 1

// ParseNetnsName returns the index of a netns name <Prefix><i> with i in
// [1, Slots] written canonically; ok is false for any other name.
func (c Config) ParseNetnsName(name string) (int, bool) {
	if i, ok := c.CanonicalNetnsIndex(name); ok && i <= c.Slots {
		return i, true
	}
	return 0, false
}

// ParseHostIfName returns the index of a host link name <Prefix>h<i> with i
// in [1, Slots]; ok is false for any other name.
func (c Config) ParseHostIfName(name string) (int, bool) {
	if i, ok := c.CanonicalHostIfIndex(name); ok && i <= c.Slots {
		return i, true
	}
	return 0, false
}

// CanonicalNetnsIndex returns the index of a netns name <Prefix><i> whose
// index is written canonically (decimal, no sign, no leading zero) with
// 1 <= i <= MaxIndex, whether or not i <= Slots: a name beyond Slots was
// left by a run with a larger Config.Slots and is ours all the same. ok is false
// for any other name (a look-alike such as <Prefix>007).
func (c Config) CanonicalNetnsIndex(name string) (int, bool) {
	s, ok := strings.CutPrefix(name, c.Prefix)
	if !ok {
		return 0, false
	}
	return parseIndex(s)
}

// CanonicalHostIfIndex is CanonicalNetnsIndex for a host link name
// <Prefix>h<i>. (No such name is longer than IFNAMSIZ-1 bytes: see
// HostIfFits.)
func (c Config) CanonicalHostIfIndex(name string) (int, bool) {
	s, ok := strings.CutPrefix(name, c.HostIfPrefix())
	if !ok {
		return 0, false
	}
	return parseIndex(s)
}

// HostIfFits reports whether slot i's host link name fits in IFNAMSIZ. An
// index for which it does not (beyond Slots, for a long prefix) can have a
// netns file but never a host link nor a set element, so none is looked
// for.
func (c Config) HostIfFits(i int) bool { return len(c.HostIfName(i)) <= maxIfName }

func parseIndex(s string) (int, bool) {
	if s == "" || len(s) > 10 || s[0] < '1' || s[0] > '9' {
		return 0, false
	}
	i, err := strconv.Atoi(s)
	if err != nil || i < 1 || i > MaxIndex || strconv.Itoa(i) != s {
		return 0, false
	}
	return i, true
}

// offset returns the address 2*(i-1)+k into the CIDR.
func (c Config) offset(i, k int) netip.Addr {
	b := c.CIDR.Addr().As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	v += uint32(2*(i-1) + k)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// Addrs returns slot i's /31: the host end's and the inside address.
func (c Config) Addrs(i int) (host, inside netip.Prefix) {
	return netip.PrefixFrom(c.offset(i, 0), 31), netip.PrefixFrom(c.offset(i, 1), 31)
}

// Slot describes slot i (without touching the kernel).
func (c Config) Slot(i int) Slot {
	h, in := c.Addrs(i)
	h6, in6 := c.Addrs6(i)
	return Slot{
		Index: i, NetnsName: c.NetnsName(i), NetnsPath: c.NetnsPath(i),
		HostIf: c.HostIfName(i), InsideIf: InsideIfName, HostAddr: h, InsideAddr: in,
		HostAddr6: h6, InsideAddr6: in6,
	}
}

// Slot is one network slot.
type Slot struct {
	// Index is the slot's index in [1, Config.Slots].
	Index int
	// NetnsName and NetnsPath name the slot's netns file.
	NetnsName, NetnsPath string
	// HostIf is the veth end in the root namespace, InsideIf the one inside.
	HostIf, InsideIf string
	// HostAddr and InsideAddr are the two addresses of the slot's /31.
	HostAddr, InsideAddr netip.Prefix
	// HostAddr6 and InsideAddr6 are the two addresses of the slot's /127
	// (Config.Addrs6); zero when Config.CIDR6 is unset.
	HostAddr6, InsideAddr6 netip.Prefix
	// NetnsID and HostIfIndex are the kernel identity of the objects
	// Manager.Create made, zero in a Slot from Config.Slot. Compare both:
	// the kernel hands a freed namespace's inode to the next namespace at
	// once, while host ifindexes are not reused until they wrap.
	NetnsID     netns.ID
	HostIfIndex int
	// Extra is what the slot has beyond All, for the teardown of a slot
	// handed back ([AssumeOf]): HasShaper once a lease's limits made its
	// ifb, which outlives the slot's links and no name lookup looks for.
	Extra Resources
}
