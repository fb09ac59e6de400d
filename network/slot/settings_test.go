package slot_test

import (
	"context"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/network/internal/nettest"
	"github.com/phasegate/phasegate/network/netns"
	"github.com/phasegate/phasegate/network/slot"
)

// sysctl is one of the host's settings as a test sets it.
type sysctl struct{ name, value string }

// setHost writes the host's sysctls in order and puts the values they had
// back in t.Cleanup, in the same order, failed test or not: a forwarding
// value first, since writing one also resets the host's accept_redirects.
func setHost(t *testing.T, set []sysctl) {
	t.Helper()
	path := func(name string) string { return "/proc/sys/" + strings.ReplaceAll(name, ".", "/") }
	var was []sysctl
	t.Cleanup(func() {
		for _, s := range was {
			if err := os.WriteFile(path(s.name), []byte(s.value), 0); err != nil {
				t.Errorf("put the host's %s=%s back: %v", s.name, s.value, err)
			}
		}
	})
	for _, s := range set {
		b, err := os.ReadFile(path(s.name))
		if err != nil {
			t.Fatalf("read the host's %s: %v", s.name, err)
		}
		was = append(was, sysctl{s.name, strings.TrimSpace(string(b))})
		if err := os.WriteFile(path(s.name), []byte(s.value), 0); err != nil {
			t.Fatalf("set the host's %s=%s: %v", s.name, s.value, err)
		}
	}
}

// hostProfiles are hosts whose settings a new namespace would copy into a
// slot: a container host (forwarding on, no reverse-path filter,
// redirects and source routes taken, IPv6 forwarding on) and one whose
// namespace-wide values no link's own can override (a loose reverse-path
// filter, loopback and local sources taken from outside).
var hostProfiles = []struct {
	name string
	set  []sysctl
}{
	{"container host", []sysctl{
		{"net.ipv4.ip_forward", "1"},
		{"net.ipv4.conf.all.rp_filter", "0"}, {"net.ipv4.conf.default.rp_filter", "0"},
		{"net.ipv4.conf.all.accept_redirects", "1"}, {"net.ipv4.conf.default.accept_redirects", "1"},
		{"net.ipv4.conf.all.send_redirects", "1"}, {"net.ipv4.conf.default.send_redirects", "1"},
		{"net.ipv4.conf.all.accept_source_route", "1"}, {"net.ipv4.conf.default.accept_source_route", "1"},
		{"net.ipv4.conf.all.arp_ignore", "0"}, {"net.ipv4.conf.default.arp_announce", "0"},
		{"net.ipv6.conf.all.forwarding", "1"}, {"net.ipv6.conf.default.forwarding", "1"},
		{"net.ipv6.conf.all.accept_redirects", "1"}, {"net.ipv6.conf.default.accept_redirects", "1"},
	}},
	{"loose host", []sysctl{
		{"net.ipv4.ip_forward", "1"},
		{"net.ipv4.conf.all.rp_filter", "2"}, {"net.ipv4.conf.default.rp_filter", "2"},
		{"net.ipv4.conf.all.route_localnet", "1"}, {"net.ipv4.conf.default.route_localnet", "1"},
		{"net.ipv4.conf.all.accept_local", "1"}, {"net.ipv4.conf.default.accept_local", "1"},
	}},
}

// A slot is the same sandbox whatever the host's administrator set: made
// on a host with the settings above, a plain slot and a guest slot read,
// from inside, the values the slot sets (settings.go), as the kernel
// combines each link's with the namespace's (linux/inetdevice.h), and
// no IPv6 address anywhere; the host end takes no redirect. The host's
// values are put back after each profile. (The pool makes its warm slots
// with Manager.Create, the path made here.)
func TestSlotsDoNotInheritTheHost(t *testing.T) {
	nettest.RequireRoot(t)
	for _, p := range hostProfiles {
		t.Run(p.name, func(t *testing.T) {
			setHost(t, p.set)
			env := nettest.New(t, 2)
			plain := env.Manager(t)
			s, err := plain.Create(context.Background(), 1)
			if err != nil {
				t.Fatal(err)
			}
			checkSettings(t, s, map[string]bool{slot.InsideIfName: false, "lo": false})
			gm, cfg := guestManager(t, 2)
			g, err := gm.Create(context.Background(), 2)
			if err != nil {
				t.Fatal(err)
			}
			checkSettings(t, g, map[string]bool{slot.InsideIfName: true, cfg.Guest.Tap: true, "lo": false})
			for _, sl := range []*slot.Slot{s, g} {
				if v := procInt(t, -1, "net/ipv4/conf/"+sl.HostIf+"/accept_redirects"); v != 0 {
					t.Errorf("host end %s: accept_redirects %d, want 0", sl.HostIf, v)
				}
				if v := procInt(t, -1, "net/ipv6/conf/"+sl.HostIf+"/disable_ipv6"); v != 1 {
					t.Errorf("host end %s: disable_ipv6 %d, want 1", sl.HostIf, v)
				}
			}
		})
	}
}

// checkSettings reads slot s's settings from inside, for each link named
// in links (true: one the slot forwards on).
func checkSettings(t *testing.T, s *slot.Slot, links map[string]bool) {
	t.Helper()
	fd, err := netns.Open(s.NetnsPath)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	all := func(name string) int { return procInt(t, fd, "net/ipv4/conf/all/"+name) }
	for link, fwd := range links {
		dev := func(name string) int { return procInt(t, fd, "net/ipv4/conf/"+link+"/"+name) }
		or := func(name string) int { return max(all(name), dev(name)) } // 0 or 1 values: OR
		and := func(name string) int { return min(all(name), dev(name)) }
		want := map[string][2]int{ // the kernel's effective value, its bounds
			"forwarding":          {b2i(fwd), b2i(fwd)},
			"rp_filter":           {1, 1},
			"accept_source_route": {0, 0},
			"arp_ignore":          {1, 2},
			"arp_announce":        {2, 2},
			"proxy_arp":           {0, 0},
			"accept_local":        {0, 0},
			"route_localnet":      {0, 0},
		}
		got := map[string]int{
			"forwarding":          dev("forwarding"),
			"rp_filter":           max(all("rp_filter"), dev("rp_filter")),
			"accept_source_route": and("accept_source_route"),
			"arp_ignore":          max(all("arp_ignore"), dev("arp_ignore")),
			"arp_announce":        max(all("arp_announce"), dev("arp_announce")),
			"proxy_arp":           or("proxy_arp"),
			"accept_local":        or("accept_local"),
			"route_localnet":      or("route_localnet"),
		}
		// Redirects: a link's own value decides for one that forwards
		// (all && dev); for one that does not, the namespace's "all"
		// may take them (all || dev), which DESIGN §5 says why is left.
		for _, name := range []string{"accept_redirects", "send_redirects", "secure_redirects"} {
			if v := dev(name); v != 0 {
				t.Errorf("slot %d, %s: %s %d, want 0", s.Index, link, name, v)
			}
		}
		if fwd {
			want["accept_redirects"] = [2]int{0, 0}
			got["accept_redirects"] = and("accept_redirects")
		}
		for name, w := range want {
			if v := got[name]; v < w[0] || v > w[1] {
				t.Errorf("slot %d, %s: %s is %d in effect, want %d..%d", s.Index, link, name, v, w[0], w[1])
			}
		}
	}
	out, err := exec.Command("nsenter", "--net="+s.NetnsPath, "ip", "-6", "addr", "show").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "" {
		t.Errorf("slot %d: IPv6 addresses inside: %v\n%s", s.Index, err, out)
	}
	// The links' multicast routes (ff00::/8) stay: no address, nothing to
	// send from.
	out, err = exec.Command("nsenter", "--net="+s.NetnsPath, "ip", "-6", "route", "show", "table", "all").CombinedOutput()
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if err != nil || (line != "" && !strings.HasPrefix(line, "multicast ff00::/8 ")) {
			t.Errorf("slot %d: IPv6 routes inside: %v\n%s", s.Index, err, out)
			break
		}
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// procInt reads /proc/sys/<name> as an integer, inside the namespace fd
// (-1: the host's).
func procInt(t *testing.T, fd int, name string) int {
	t.Helper()
	var b []byte
	read := func() (err error) { b, err = os.ReadFile("/proc/sys/" + name); return err }
	var err error
	if fd < 0 {
		err = read()
	} else {
		err = netns.Do(fd, read)
	}
	if err != nil {
		t.Fatal(err)
	}
	v, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("/proc/sys/%s: %v", name, err)
	}
	return v
}

// RepairSettings puts back what a slot's root changed of the links'
// settings and the IPv6 it added, and nothing of a slot as it was made.
func TestRepairSettings(t *testing.T) {
	m, cfg := guestManager(t, 2)
	s, err := m.Create(context.Background(), 1)
	if err != nil {
		t.Fatal(err)
	}
	if rep, err := m.RepairSettings(s); err != nil || len(rep) != 0 {
		t.Fatalf("RepairSettings of a slot as made: %v, %v; want nothing", rep, err)
	}
	for _, args := range [][]string{
		{"sysctl", "-qw", "net.ipv4.conf.eth0.rp_filter=0"},
		{"sysctl", "-qw", "net.ipv4.conf." + cfg.Guest.Tap + ".accept_redirects=1"},
		{"ip", "-6", "addr", "add", "fd00::1/64", "dev", slot.InsideIfName, "nodad"},
		{"ip", "-6", "addr", "add", "::1/128", "dev", "lo"},
	} {
		if out, err := exec.Command("nsenter", append([]string{"--net=" + s.NetnsPath}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("%v inside: %v\n%s", args, err, out)
		}
	}
	rep, err := m.RepairSettings(s)
	want := []string{"settings of " + slot.InsideIfName, "settings of " + cfg.Guest.Tap, "IPv6 address ::1/128 on lo", "IPv6 address fd00::1/64 on " + slot.InsideIfName}
	slices.Sort(rep)
	slices.Sort(want)
	if err != nil || !slices.Equal(rep, want) {
		t.Errorf("RepairSettings: %v, %v; want %v", rep, err, want)
	}
	checkSettings(t, s, map[string]bool{slot.InsideIfName: true, cfg.Guest.Tap: true, "lo": false})
}
