package slot_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/network/internal/nettest"
	"github.com/phasegate/phasegate/network/netns"
	"github.com/phasegate/phasegate/network/slot"
)

// RepairHost finds a slot as it was left and touches nothing; one whose
// host link was set down and lost its address gets both back, its
// namespace untouched. It no longer lists the host's addresses (a dump that
// a busy host interrupts, and quadratic over a restore): adding the address
// says whether it was there.
func TestRepairHost(t *testing.T) {
	env := nettest.New(t, 4)
	m := env.Manager(t)
	ctx := context.Background()
	if _, err := m.Create(ctx, 2); err != nil {
		t.Fatal(err)
	}
	s, err := m.Lookup(2)
	if err != nil {
		t.Fatal(err)
	}
	if repaired, err := m.RepairHost(s); err != nil || len(repaired) != 0 {
		t.Fatalf("RepairHost of an intact slot: %v, %v; want nothing repaired", repaired, err)
	}
	link, err := netlink.LinkByName(s.HostIf)
	if err != nil {
		t.Fatal(err)
	}
	addrs := hostAddrs(t, link, netlink.FAMILY_V4)
	if len(addrs) != 1 {
		t.Fatalf("addresses of %s: %v", s.HostIf, addrs)
	}
	if err := netlink.AddrDel(link, &addrs[0]); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetDown(link); err != nil {
		t.Fatal(err)
	}
	repaired, err := m.RepairHost(s)
	if err != nil || !slices.Equal(repaired, []string{"link up", "address " + s.HostAddr.String()}) {
		t.Fatalf("RepairHost of a slot down without its address: %v, %v", repaired, err)
	}
	checkSlot(t, m, s)
}

// Identify says a slot is the recorded one only when both its namespace
// and its host link have the recorded identity, and says which differs
// otherwise, without touching anything.
func TestIdentify(t *testing.T) {
	env := nettest.New(t, 4)
	m := env.Manager(t)
	ctx := context.Background()
	s, err := m.Create(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	other := netns.ID{Dev: s.NetnsID.Dev, Ino: s.NetnsID.Ino + 1}
	tests := []struct {
		name    string
		ns      netns.ID
		ifindex int
		index   int
		want    string // "" for the slot; else a part of the ErrGone message
	}{
		{"as recorded", s.NetnsID, s.HostIfIndex, 3, ""},
		{"namespace made again", other, s.HostIfIndex, 3, "not the one recorded (made again since)"},
		{"host link made again", s.NetnsID, s.HostIfIndex + 100000, 3, fmt.Sprintf("host link %s is not the one recorded (index %d", s.HostIf, s.HostIfIndex)},
		{"never made", s.NetnsID, s.HostIfIndex, 4, "namespace"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := m.Identify(tt.index, tt.ns, tt.ifindex)
			if tt.want == "" {
				if err != nil || got.NetnsID != s.NetnsID || got.HostIfIndex != s.HostIfIndex || got.HostIf != s.HostIf {
					t.Fatalf("Identify = %+v, %v; want slot %d as created", got, err, s.Index)
				}
				return
			}
			if !errors.Is(err, slot.ErrGone) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Identify = %+v, %v; want ErrGone saying %q", got, err, tt.want)
			}
		})
	}
	// Its host link deleted: gone, whatever the namespace says.
	link, err := netlink.LinkByIndex(s.HostIfIndex)
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkDel(link); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Identify(3, s.NetnsID, s.HostIfIndex); !errors.Is(err, slot.ErrGone) || !strings.Contains(err.Error(), "host link "+s.HostIf) {
		t.Fatalf("Identify after the host link was deleted: %v; want ErrGone naming the link", err)
	}
}

// The host end of a slot has no IPv6 address and no IPv6 route in any
// table: each one would make every slot's neighbour and multicast traffic
// cost a walk over all the slots' routes (see quietIPv6). Nor has the
// inside (no IPv6 is configured in a slot).
func TestHostEndHasNoIPv6(t *testing.T) {
	if _, err := os.Stat("/proc/sys/net/ipv6"); err != nil {
		t.Skip("no IPv6 in this kernel")
	}
	env := nettest.New(t, 2)
	m := env.Manager(t)
	s, err := m.Create(context.Background(), 1)
	if err != nil {
		t.Fatal(err)
	}
	host, err := netlink.LinkByIndex(s.HostIfIndex)
	if err != nil {
		t.Fatal(err)
	}
	// Duplicate address detection would add the link-local address within
	// a second of the link coming up; give it that second.
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		if addrs := hostAddrs(t, host, netlink.FAMILY_V6); len(addrs) > 0 {
			t.Fatalf("IPv6 addresses on the host end %s: %v", s.HostIf, addrs)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// In every table: the per-device multicast route (ff00::/8, table
	// local) costs as much as the link-local one.
	var routes []netlink.Route
	hostDump(t, "IPv6 routes", func() (err error) {
		routes, err = netlink.RouteListFiltered(netlink.FAMILY_V6, &netlink.Route{LinkIndex: s.HostIfIndex, Table: unix.RT_TABLE_UNSPEC},
			netlink.RT_FILTER_OIF|netlink.RT_FILTER_TABLE)
		return err
	})
	if len(routes) > 0 {
		t.Errorf("IPv6 routes through the host end %s: %v", s.HostIf, routes)
	}
	// Nor has the inside: IPv6 is off in a slot (settings.go).
	out, err := exec.Command("nsenter", "--net="+s.NetnsPath, "ip", "-6", "addr", "show").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "" {
		t.Errorf("IPv6 addresses inside the slot: %v\n%s", err, out)
	}
}

// hostDump runs a dump of the host's netlink tables until the kernel does
// not interrupt it: links and addresses change all the time on the host
// while other test packages run, and an interrupted dump may miss entries
// (a fresh-clone run failed TestRepairHost on one).
func hostDump(t *testing.T, what string, dump func() error) {
	t.Helper()
	var err error
	for range 20 {
		if err = dump(); !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	if err != nil {
		t.Fatalf("list %s on the host: %v", what, err)
	}
}

// hostAddrs lists the addresses of a host link (see hostDump).
func hostAddrs(t *testing.T, link netlink.Link, family int) []netlink.Addr {
	t.Helper()
	var addrs []netlink.Addr
	hostDump(t, "addresses of "+link.Attrs().Name, func() (err error) {
		addrs, err = netlink.AddrList(link, family)
		return err
	})
	return addrs
}

// RecreateHost puts the veth pair of a slot whose host link was deleted
// back into its namespace, with a process inside kept as it was (same
// namespace, alive, reachable again); a slot whose namespace is not the
// one given, or whose host link is there, is refused untouched.
func TestRecreateHost(t *testing.T) {
	env := nettest.New(t, 4)
	m, err := slot.NewManager(context.Background(), env.Config, slot.Options{Stamp: "0123456789abcdef"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s, err := m.Create(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	inside := nettest.StartInside(t, s.NetnsPath)
	echo := slot.EchoIn(t, s.NetnsPath, s.InsideAddr.Addr())
	if err := m.RecreateHost(ctx, s); err == nil || errors.Is(err, slot.ErrGone) {
		t.Fatalf("RecreateHost of an intact slot: %v; want a refusal naming its host link", err)
	}
	old := s.HostIfIndex
	link, err := netlink.LinkByIndex(old)
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkDel(link); err != nil {
		t.Fatal(err)
	}
	wrong := *s
	wrong.NetnsID.Ino++
	if err := m.RecreateHost(ctx, &wrong); !errors.Is(err, slot.ErrGone) {
		t.Fatalf("RecreateHost of another namespace: %v; want ErrGone", err)
	}
	if err := m.RecreateHost(ctx, s); err != nil {
		t.Fatal(err)
	}
	if s.HostIfIndex == old || s.HostIfIndex == 0 {
		t.Fatalf("host ifindex %d after the repair (was %d)", s.HostIfIndex, old)
	}
	checkSlot(t, m, s)
	if id, err := netns.Stat(s.NetnsPath); err != nil || id != s.NetnsID {
		t.Fatalf("namespace after the repair: %v %v, want %v", id, err, s.NetnsID)
	}
	if err := inside.Process.Signal(unix.Signal(0)); err != nil {
		t.Fatalf("the process inside: %v", err)
	}
	if _, err := m.Identify(2, s.NetnsID, s.HostIfIndex); err != nil {
		t.Fatalf("Identify after the repair: %v", err)
	}
	// The listener made before the host link went answers through the
	// new one.
	c, err := net.DialTimeout("tcp", echo.String(), 5*time.Second)
	if err != nil {
		t.Fatalf("dial inside after the repair: %v", err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 4)
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo inside after the repair: %q %v", buf, err)
	}
	other, err := slot.NewManager(ctx, env.Config, slot.Options{Stamp: "fedcba9876543210"})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := other.Stamps(ctx); err != nil || st[2] != "0123456789abcdef" {
		t.Fatalf("stamps another manager sees: %v, %v; want slot 2 stamped by the first", st, err)
	}
	if st, err := m.Stamps(ctx); err != nil || len(st) != 0 {
		t.Fatalf("stamps the manager that made slot 2 sees: %v, %v; want none but its own", st, err)
	}
}
