package test

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/phasegate/phasegate/network/nft"
)

// refusedAtStart waits for d to exit and checks it exited 2 with a last
// line that names want, having created nothing of h.
func refusedAtStart(t *testing.T, d *daemon, h *host, want string) {
	t.Helper()
	if code := d.wait(time.Minute); code != 2 {
		t.Fatalf("the daemon exited %d, want 2:\n%s", code, d.Output())
	}
	all := lines(d.Output())
	if last := all[len(all)-1]; !strings.Contains(last, want) {
		t.Errorf("its last line does not name %q:\n%s", want, last)
	}
	if got := h.links(h.prefix); len(got) > 0 {
		t.Errorf("the refused daemon made host links %v", got)
	}
	if got := h.netnsFiles(h.prefix); len(got) > 0 {
		t.Errorf("the refused daemon made netns files %v", got)
	}
	if h.hasTable(h.prefix) {
		t.Errorf("the refused daemon made its firewall table")
	}
	if _, err := os.Stat(filepath.Join(h.stateDir, "slots.db")); err == nil {
		t.Errorf("the refused daemon made its state file")
	}
	if _, err := os.Lstat(filepath.Join(h.stateDir, "control.sock")); err == nil {
		t.Errorf("the refused daemon left its control socket")
	}
}

// routesOf is the host's IPv4 routes, in every table, on the host links
// of prefix.
func routesOf(t *testing.T, prefix string) []string {
	t.Helper()
	var out []string
	for _, r := range hostRoutes(t) {
		if strings.Contains(r, " dev "+prefix+"h") {
			out = append(out, r)
		}
	}
	return out
}

// hostRoutes is the host's IPv4 routes in every table, one per line.
func hostRoutes(t *testing.T) []string {
	t.Helper()
	return lines(run(t, "ip", "-4", "route", "show", "table", "all"))
}

// subPrefix is the first half of cidr: overlapping it without being equal.
func subPrefix(t *testing.T, cidr string) string {
	t.Helper()
	p := netip.MustParsePrefix(cidr)
	return netip.PrefixFrom(p.Addr(), p.Bits()+1).String()
}

// TestSecondDaemonOnTheSameAddresses: a second daemon, with a prefix of
// its own, on the first one's CIDR or one that overlaps it, exits 2 naming
// the first, creates nothing, and leaves the first untouched; the same
// when the first is gone but its leased slots are still on the host (the
// second names the other daemon's device).
func TestSecondDaemonOnTheSameAddresses(t *testing.T) {
	first := newHost(t)
	a := start(t, nil, first.args(freePort(t), "--slots=64")...)
	a.waitServing(time.Minute)
	waitFor(t, 30*time.Second, "the first daemon's 4 warm slots", func() bool { return len(first.links(first.prefix)) == 4 })
	// The first's routes, not the host's: other test packages make and
	// remove slots of their own meanwhile.
	links, routes := first.links(first.prefix), routesOf(t, first.prefix)
	pid := "pid " + strconv.Itoa(a.Pid())
	for _, tc := range []struct{ name, cidr, want string }{
		{"same CIDR", first.cidr, pid},
		{"inside it", subPrefix(t, first.cidr), pid},
		{"around it", netip.PrefixFrom(netip.MustParsePrefix(first.cidr).Addr(), 16).Masked().String(), pid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			second := newHost(t)
			b := start(t, nil, second.args(freePort(t), "--slots=64", "--slot-cidr="+tc.cidr)...)
			refusedAtStart(t, b, second, tc.want)
		})
	}
	if code, _, err := a.get("/readyz"); err != nil || code != 200 {
		t.Errorf("the first daemon no longer serves: %d %v", code, err)
	}
	if now := first.links(first.prefix); !slices.Equal(now, links) {
		t.Errorf("the first daemon's links changed: %v, now %v", links, now)
	}
	if now := routesOf(t, first.prefix); !slices.Equal(now, routes) {
		t.Errorf("the first daemon's routes changed:\nwas %q\nnow %q", routes, now)
	}

	// Killed, the first leaves its slots on the host (a restart would
	// restore them): a second daemon is refused for them, naming its
	// device; the first, restarted, takes them back.
	a.signal(syscall.SIGKILL)
	a.wait(10 * time.Second)
	second := newHost(t)
	b := start(t, nil, second.args(freePort(t), "--slots=64", "--slot-cidr="+first.cidr)...)
	refusedAtStart(t, b, second, "dev "+first.prefix+"h")
	again := start(t, nil, first.args(freePort(t), "--slots=64")...)
	again.waitServing(time.Minute)
	again.signal(syscall.SIGTERM)
	if code := again.wait(time.Minute); code != 0 {
		t.Errorf("the restarted first daemon exited %d", code)
	}
	first.decommission(first.prefix)
}

// TestDaemonsStartedAtOnceOnOneCIDR: two daemons with prefixes of their
// own started at the same instant on one CIDR: exactly one serves, the
// other exits 2 naming it.
func TestDaemonsStartedAtOnceOnOneCIDR(t *testing.T) {
	hosts := []*host{newHost(t), newHost(t)}
	cidr := hosts[0].cidr
	daemons := make([]*daemon, len(hosts))
	var wg sync.WaitGroup
	for i, h := range hosts {
		wg.Go(func() { daemons[i] = start(t, nil, h.args(freePort(t), "--slots=64", "--slot-cidr="+cidr)...) })
	}
	wg.Wait()
	var exited []int
	waitFor(t, time.Minute, "one of the two daemons to exit", func() bool {
		exited = exited[:0]
		for i, d := range daemons {
			select {
			case <-d.Done():
				exited = append(exited, i)
			default:
			}
		}
		return len(exited) > 0
	})
	if len(exited) != 1 {
		t.Fatalf("both daemons exited:\n%s\n%s", daemons[0].Output(), daemons[1].Output())
	}
	loser, winner := exited[0], 1-exited[0]
	daemons[winner].waitServing(time.Minute)
	refusedAtStart(t, daemons[loser], hosts[loser], "pid "+strconv.Itoa(daemons[winner].Pid()))
	writeReport(t, "cidr-race.txt", fmt.Sprintf("two daemons at once on %s (prefixes %s, %s): 1 served, 1 exited 2 naming it\n", cidr, hosts[0].prefix, hosts[1].prefix))
}

// TestDaemonsOnDisjointCIDRs: two daemons with prefixes and CIDRs of their
// own both serve, and each tenant is reached at its own address, behind
// its own daemon's host link, and only there.
func TestDaemonsOnDisjointCIDRs(t *testing.T) {
	hosts := []*host{newHost(t), newHost(t)}
	for _, h := range hosts {
		d := start(t, nil, h.args(freePort(t), "--slots=64")...)
		d.waitServing(time.Minute)
	}
	for i, h := range hosts {
		other := hosts[1-i]
		netnsPath := filepath.Join(h.netnsDir, h.prefix+"1")
		waitFor(t, 30*time.Second, "slot 1 of "+h.prefix, func() bool { _, err := os.Stat(netnsPath); return err == nil })
		inside := netip.MustParsePrefix(h.cidr).Addr().Next().String()
		route := run(t, "ip", "-4", "route", "get", inside)
		if !strings.Contains(route, "dev "+h.prefix+"h1 ") {
			t.Errorf("the host routes %s (slot 1 of %s) as %q, not to %sh1", inside, h.prefix, route, h.prefix)
		}
		for _, r := range hostRoutes(t) {
			dst, _, _ := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(r, "local "), "broadcast "), " ")
			if p, err := netip.ParsePrefix(dst); err == nil && p.Overlaps(netip.MustParsePrefix(h.cidr)) && strings.Contains(r, "dev "+other.prefix) {
				t.Errorf("a route of %s's CIDR goes to the other daemon's link: %s", h.prefix, r)
			}
		}
		if out := run(t, "nsenter", "--net="+filepath.Join(other.netnsDir, other.prefix+"1"), "ip", "-4", "-o", "addr"); strings.Contains(out, " "+inside+"/") {
			t.Errorf("the other daemon's slot holds %s: %s", inside, out)
		}
		w := startWorkload(t, 1, netnsPath, inside)
		waitFor(t, 30*time.Second, "the tenant of "+h.prefix+" to answer at "+inside, func() bool { return w.ok.Load() > 0 })
		close(w.stop)
		<-w.done
	}
}

// TestCIDROverlappingAHostInterface: in a network namespace the test made
// (the daemon checks the one it runs in), a --slot-cidr that overlaps the
// address of an interface there is refused with exit 2 in one line naming
// the interface, before anything is locked, bound or made: no lock file,
// no state directory (on 65cb2fe the lock and listen phases ran first,
// logged, and left the lock file); a CIDR beside it serves.
func TestCIDROverlappingAHostInterface(t *testing.T) {
	h := newHost(t)
	ns := "pgt-" + strings.TrimSuffix(h.prefix, "-")
	run(t, "ip", "netns", "add", ns)
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", ns, err, out)
		}
	})
	in := func(args ...string) string { return run(t, "ip", append([]string{"netns", "exec", ns}, args...)...) }
	in("ip", "link", "set", "lo", "up")
	in("ip", "link", "add", "uplink0", "type", "veth", "peer", "name", "uplink1")
	in("ip", "addr", "add", "10.77.1.1/24", "dev", "uplink0")
	in("ip", "link", "set", "uplink0", "up")
	serve := func(cidr string) *daemon {
		args := append([]string{"netns", "exec", ns, binary}, h.args("127.0.0.1:5008", "--slots=16", "--slot-cidr="+cidr)...)
		return startBinary(t, "ip", nil, args...)
	}
	d := serve("10.77.0.0/22")
	if code := d.wait(time.Minute); code != 2 {
		t.Fatalf("the daemon exited %d, want 2:\n%s", code, d.Output())
	}
	if all := lines(d.Output()); len(all) != 1 || !strings.Contains(all[0], "10.77.1.1/24 dev uplink0") {
		t.Errorf("the output is not one line naming the interface's address:\n%s", d.Output())
	}
	h.nothingMade(t)
	if out := in("ip", "-o", "link"); strings.Contains(out, h.prefix) {
		t.Errorf("the refused daemon made links: %s", out)
	}
	if out := in("nft", "list", "tables"); strings.Contains(out, nft.TableName(h.prefix)) {
		t.Errorf("the refused daemon made its table: %s", out)
	}

	ok := serve("10.78.0.0/22")
	waitFor(t, time.Minute, "the daemon beside the interface to serve", func() bool {
		return exec.Command("ip", "netns", "exec", ns, binary, "probe", "--addr=127.0.0.1:5008").Run() == nil
	})
	ok.signal(syscall.SIGTERM)
	if code := ok.wait(time.Minute); code != 0 {
		t.Errorf("it exited %d:\n%s", code, ok.Output())
	}
	// What it kept lives in the test's namespace: the namespace's
	// deletion takes the links with it, the table too.
	run(t, "ip", "netns", "exec", ns, binary, "decommission", "--destroy-leased-slots", "--netns-dir="+h.netnsDir,
		"--slot-prefix="+h.prefix, "--slots=16", "--slot-cidr=10.78.0.0/22", "--state-dir="+h.stateDir)
}

// TestSecondDaemonOnTheSameIPv6Range: two daemons with prefixes and IPv4
// CIDRs of their own but one IPv6 range (--slot-cidr6): the second exits
// 2 naming the first and the flag, having created nothing, though the host
// shows nothing of the first's range yet (its pool is empty, so no host
// end has an address there): the range lock, not the host check, keeps
// them apart, as two starting at the same instant would need; and an
// in-place upgrade of the first keeps it.
func TestSecondDaemonOnTheSameIPv6Range(t *testing.T) {
	first, second := newHost(t), newHost(t)
	cidr6 := randomULA()
	d1 := start(t, nil, first.args(freePort(t), "--slots=16", "--pool-size=0", "--pool-min-ready=0", "--slot-cidr6="+cidr6.String())...)
	d1.waitServing(time.Minute)
	d2 := start(t, nil, second.args(freePort(t), "--slots=16", "--slot-cidr6="+cidr6.String())...)
	refusedAtStart(t, d2, second, "give each daemon on a host a --slot-cidr6 of its own")
	if !strings.Contains(d2.Output(), "pid "+strconv.Itoa(d1.Pid())) {
		t.Errorf("the refusal does not name the first daemon (pid %d):\n%s", d1.Pid(), d2.Output())
	}

	// An in-place upgrade hands the range's lock to the new image: no
	// moment without it.
	served := strings.Count(d1.Output(), "msg=serving ")
	d1.signal(syscall.SIGHUP)
	waitFor(t, 2*time.Minute, "the upgraded first daemon to serve", func() bool {
		return strings.Count(d1.Output(), "msg=serving ") > served
	})
	if !strings.Contains(d1.Output(), "cidr6-lock") {
		t.Errorf("the upgrade handed over no cidr6-lock:\n%s", d1.Output())
	}
	d3 := start(t, nil, second.args(freePort(t), "--slots=16", "--slot-cidr6="+cidr6.String())...)
	refusedAtStart(t, d3, second, "give each daemon on a host a --slot-cidr6 of its own")
	d1.signal(syscall.SIGTERM)
	if code := d1.wait(time.Minute); code != 0 {
		t.Fatalf("the first daemon exited %d:\n%s", code, d1.Output())
	}
}
