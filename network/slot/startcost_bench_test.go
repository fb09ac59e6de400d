package slot_test

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/network/internal/nettest"
	"github.com/phasegate/phasegate/network/slot"
)

// BenchmarkStartReads measures what a restart reads of the host before it
// serves, on $PHASEGATE_BENCH_SLOTS real slots (default 200): the host
// check (ForeignUses) and the host's addresses an egress policy denies
// (HostAddrs), each beside the way it read the host before, through
// vishvananda/netlink's structs (foreignUsesLibrary, hostAddrsLibrary),
// and the scan (Survey). Every slot is removed by the playground's cleanup. Run
// it in a network namespace of its own, so that other slots being made on
// the host do not interrupt its dumps:
//
//	sudo ip netns add b
//	sudo ip netns exec b env PHASEGATE_BENCH_SLOTS=10000 go test -run '^$' -bench StartReads -benchtime 20x -benchmem ./network/slot/
//	sudo ip netns del b
func BenchmarkStartReads(b *testing.B) {
	n := 200
	if s := os.Getenv("PHASEGATE_BENCH_SLOTS"); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil {
			b.Fatalf("PHASEGATE_BENCH_SLOTS: %v", err)
		}
	}
	env := nettest.New(b, n)
	m := env.Manager(b)
	indices := make([]int, n)
	for i := range indices {
		indices[i] = i + 1
	}
	nettest.Leak(b, m, indices)
	cfg := env.Config

	// Both ways must find nothing foreign on the daemon's own slots.
	for _, f := range []func() ([]slot.HostUse, error){cfg.ForeignUses, func() ([]slot.HostUse, error) { return foreignUsesLibrary(cfg) }} {
		if uses, err := f(); err != nil || len(uses) != 0 {
			b.Fatalf("on its own slots: uses %v, error %v", uses, err)
		}
	}
	b.Run("ForeignUses/library", func(b *testing.B) {
		for b.Loop() {
			if _, err := foreignUsesLibrary(cfg); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("ForeignUses", func(b *testing.B) {
		for b.Loop() {
			if _, err := cfg.ForeignUses(); err != nil {
				b.Fatal(err)
			}
		}
	})
	// Both ways find the same host addresses outside the CIDR.
	addrs, err := cfg.HostAddrs()
	if err != nil {
		b.Fatal(err)
	}
	if lib, err := hostAddrsLibrary(cfg); err != nil || !slices.Equal(addrs, lib) {
		b.Fatalf("host addresses: %v, the library's way %v (error %v)", addrs, lib, err)
	}
	b.Run("HostAddrs/library", func(b *testing.B) {
		for b.Loop() {
			if _, err := hostAddrsLibrary(cfg); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("HostAddrs", func(b *testing.B) {
		for b.Loop() {
			if _, err := cfg.HostAddrs(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Survey", func(b *testing.B) {
		for b.Loop() {
			r, err := slot.Survey(context.Background(), cfg)
			if err != nil {
				b.Fatal(err)
			}
			if len(r.Inventory) != n {
				b.Fatalf("survey found %d slots, want %d", len(r.Inventory), n)
			}
		}
	})
}

// foreignUsesLibrary is how ForeignUses read the host before: both dumps
// through vishvananda/netlink, a struct per entry, and one ioctl per link
// to name it. Kept as the benchmark's baseline.
func foreignUsesLibrary(c slot.Config) ([]slot.HostUse, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	names := map[int]string{}
	own := func(index int) (string, bool) {
		if index == 0 {
			return "", false
		}
		name, ok := names[index]
		if !ok {
			if ifr, err := unix.NewIfreq(""); err == nil {
				ifr.SetUint32(uint32(index))
				if unix.IoctlIfreq(fd, unix.SIOCGIFNAME, ifr) == nil {
					name = ifr.Name()
				}
			}
			names[index] = name
		}
		_, mine := c.CanonicalHostIfIndex(name)
		return name, mine
	}
	addrs, err := libraryAddrs()
	if err != nil {
		return nil, err
	}
	var uses []slot.HostUse
	for _, a := range addrs {
		p, ok := slot.PrefixOf(a.IPNet)
		if !ok || !p.Overlaps(c.CIDR) {
			continue
		}
		if name, mine := own(a.LinkIndex); !mine {
			uses = append(uses, slot.HostUse{Prefix: p, Dev: name})
		}
	}
	var routes []netlink.Route
	for range 10 {
		routes, err = netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	if err != nil {
		return nil, err
	}
	for _, r := range routes {
		p, ok := slot.PrefixOf(r.Dst)
		if !ok || p.Bits() == 0 || !p.Overlaps(c.CIDR) {
			continue
		}
		if name, mine := own(r.LinkIndex); !mine {
			uses = append(uses, slot.HostUse{Route: true, Prefix: p, Dev: name, Table: r.Table})
		}
	}
	slices.SortStableFunc(uses, func(a, b slot.HostUse) int { return b.Prefix.Bits() - a.Prefix.Bits() })
	return uses, nil
}

// hostAddrsLibrary is how HostAddrs read the host before: the address
// dump through vishvananda/netlink, and one ioctl per address to name its
// link, dropping those on the configuration's own links. Kept as the
// benchmark's baseline.
func hostAddrsLibrary(c slot.Config) ([]netip.Prefix, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	addrs, err := libraryAddrs()
	if err != nil {
		return nil, err
	}
	var out []netip.Prefix
	for _, a := range addrs {
		p, ok := slot.PrefixOf(a.IPNet)
		if !ok {
			continue
		}
		name := ""
		if ifr, err := unix.NewIfreq(""); err == nil {
			ifr.SetUint32(uint32(a.LinkIndex))
			if unix.IoctlIfreq(fd, unix.SIOCGIFNAME, ifr) == nil {
				name = ifr.Name()
			}
		}
		if _, mine := c.CanonicalHostIfIndex(name); !mine {
			out = append(out, netip.PrefixFrom(p.Addr(), 32))
		}
	}
	return out, nil
}

// libraryAddrs is the host's IPv4 addresses through vishvananda/netlink,
// the dump asked again while the kernel interrupts it (at most 10 times):
// the baselines' way of reading them.
func libraryAddrs() (addrs []netlink.Addr, err error) {
	for range 10 {
		if addrs, err = netlink.AddrList(nil, netlink.FAMILY_V4); !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	return addrs, err
}
