package test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
)

// Slots follow the host's network as it changes (issue 48, item 7). The
// daemon starts on a node with no way out: its egress check warns so.
// Then the node gains an uplink (a namespace behind a veth pair, with a
// default route through it), as a host gains a VPN or a CNI bridge after
// the daemon's start: a lease made before it and one made after it reach
// the outside at once, and the warning, which the start's check raised,
// clears without a restart. An address the node then takes inside the
// slot CIDR (as a VPN that pushes an overlapping range would) raises a
// warning naming it, which clears when the address goes. On 65cb2fe the
// warnings stayed as the start had found the host.
func TestSlotsFollowTheHostsNetwork(t *testing.T) {
	n := newNode(t)
	inNode(t, n, "sysctl -q -w net.ipv4.ip_forward=1 net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0")
	h, d, slots := slotsInNode(t, n, nil, []string{"before"}, nil)
	waitFor(t, 30*time.Second, "the start's egress check to warn of no way out", func() bool {
		return strings.Contains(nodeWarning(n, d, "egress"), "route")
	})

	// The daemon's own churn (a slot leased, released, torn down and
	// made again) is not the host's.
	churn, id := acquireIn(t, d, "churn")
	release(t, d, churn, id)
	time.Sleep(2 * time.Second) // more than a burst's settling
	if line := grepLines(d.Output(), "the host's network changed"); line != "" {
		t.Errorf("the daemon's own slots were taken for changes of the host:\n%s", line)
	}

	o := newOutside(t, n) // the uplink, after the daemon's start
	slots["after"], _ = acquireIn(t, d, "after")
	pub := newPublicDir(t)
	for _, name := range []string{"before", "after"} {
		s := slots[name]
		payload := "from the lease made " + name + " the uplink"
		attack(t, pub.testBinary, s.GetNetnsPath(), fmt.Sprintf("udp|%s|%s|%s|3", addrOf(t, s.GetInsideAddress(), 7300), o.reflector, payload), "")
		if !waitSeen(o, payload) {
			t.Errorf("the lease made %s the uplink does not reach the outside through it", name)
		}
	}
	waitFor(t, 30*time.Second, "the egress warning to clear once the host has a way out", func() bool {
		return nodeWarning(n, d, "egress") == ""
	})

	// An address inside the slot CIDR, on a link that is not a slot's.
	inCIDR := lastAddrOf(t, h)
	inNode(t, n, "ip link add pgtest-vpn0 type veth peer name pgtest-vpn1 && ip addr add "+inCIDR+"/32 dev pgtest-vpn0 && ip link set pgtest-vpn0 up")
	waitFor(t, 30*time.Second, "a warning naming the address the host took in the slot CIDR", func() bool {
		return strings.Contains(nodeWarning(n, d, "host-overlap"), inCIDR)
	})
	inNode(t, n, "ip link del pgtest-vpn0")
	waitFor(t, 30*time.Second, "the overlap warning to clear", func() bool { return nodeWarning(n, d, "host-overlap") == "" })
}

// inNode runs the shell command cmd in node n's namespace.
func inNode(t *testing.T, n *node, cmd string) {
	t.Helper()
	run(t, "nsenter", "--net="+n.ns, "--", "sh", "-c", cmd)
}

// acquireIn leases a slot of d for owner, as root: the slot and its lease
// id.
func acquireIn(t *testing.T, d *daemon, owner string) (*phasegatev1.Slot, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	resp, err := d.slots().Acquire(ctx, &phasegatev1.AcquireRequest{Owner: owner, RequestId: owner})
	if err != nil {
		t.Fatalf("Acquire %s: %v", owner, err)
	}
	return resp.GetSlot(), resp.GetLeaseId()
}

// release ends the lease id of slot s of d, as root.
func release(t *testing.T, d *daemon, s *phasegatev1.Slot, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := d.slots().Release(ctx, &phasegatev1.ReleaseRequest{Index: s.GetIndex(), LeaseId: id}); err != nil {
		t.Fatalf("Release %d: %v", s.GetIndex(), err)
	}
}

// lastAddrOf is the last address of h's slot CIDR, which no slot of a
// daemon with a few slots uses.
func lastAddrOf(t *testing.T, h *host) string {
	t.Helper()
	p, err := netip.ParsePrefix(h.cidr)
	if err != nil {
		t.Fatal(err)
	}
	a := p.Masked().Addr().As4()
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
	v |= 1<<(32-p.Bits()) - 1
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}).String()
}

// nodeWarning is the detail of the daemon's health warning name, asked
// from inside node n; "" when it has none.
func nodeWarning(n *node, d *daemon, name string) string {
	c := http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DialContext: n.dial}}
	resp, err := c.Get("http://" + d.addr + "/readyz/warning/" + name)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	detail, ok := strings.CutPrefix(strings.TrimSpace(string(b)), "warn: ")
	if resp.StatusCode != http.StatusOK || !ok {
		return ""
	}
	return detail
}

// A restart of a configuration the host check passed earlier in this boot
// checks the host after its port, not before (issue 48, item 1: on a
// host with thousands of the daemon's own slots the check reads every
// one's addresses and routes, which the first answer would wait for).
// What the host gained in the range meanwhile is then the health warning
// host-overlap, as when it gains it while the daemon runs; and the start
// after that checks before its port again, and refuses, exit 2. So for
// --slot-cidr and for --slot-cidr6.
func TestARestartChecksTheHostAfterItsPort(t *testing.T) {
	for _, family := range []string{"IPv4", "IPv6"} {
		t.Run(family, func(t *testing.T) {
			h := newHost(t)
			args := h.args(freePort(t), "--slots=16")
			taken, ip := lastAddrOf(t, h)+"/32", "-4"
			if family == "IPv6" {
				cidr6 := randomULA()
				args = append(args, "--slot-cidr6="+cidr6.String())
				last := cidr6.Addr().As16()
				copy(last[8:], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe})
				taken, ip = netip.AddrFrom16(last).String()+"/128", "-6"
			}
			restartAfterTheHostTook(t, h, args, ip, taken)
		})
	}
}

// restartAfterTheHostTook starts a daemon with args and stops it, gives
// the host a blackhole route to taken (ip -4 or -6) in its range, and
// checks the next start warns of it after its port and the one after it
// refuses before.
func restartAfterTheHostTook(t *testing.T, h *host, args []string, ip, taken string) {
	t.Helper()
	marker := filepath.Join(h.stateDir, "host-checked")
	stop := func(d *daemon) {
		t.Helper()
		d.signal(syscall.SIGTERM)
		if code := d.wait(time.Minute); code != 0 {
			t.Fatalf("exit %d:\n%s", code, d.Output())
		}
	}
	d := start(t, nil, args...)
	d.waitServing(time.Minute)
	waitFor(t, 30*time.Second, "the passed check's record in the state directory", func() bool {
		_, err := os.Stat(marker)
		return err == nil
	})
	stop(d)

	// The host takes an address of the range while the daemon is down.
	run(t, "ip", ip, "route", "add", "blackhole", taken)
	t.Cleanup(func() { _ = exec.Command("ip", ip, "route", "del", "blackhole", taken).Run() })

	d = start(t, nil, args...)
	d.waitServing(time.Minute)
	waitFor(t, 30*time.Second, "a warning naming the route the host took in the slot CIDR", func() bool {
		return strings.Contains(d.warning("host-overlap"), "route "+taken)
	})
	if _, err := os.Stat(marker); !os.IsNotExist(err) {
		t.Errorf("the check's record is still there after the check found an overlap: %v", err)
	}
	stop(d)

	d = start(t, nil, args...)
	if code := d.wait(time.Minute); code != 2 {
		t.Fatalf("exit %d, want 2:\n%s", code, d.Output())
	}
	if want := "overlaps what the host already uses: route " + taken; !strings.Contains(d.Output(), want) {
		t.Errorf("the refusal does not say %q:\n%s", want, d.Output())
	}
	if strings.Contains(d.Output(), "msg=listening") {
		t.Errorf("the refused start bound its port:\n%s", d.Output())
	}
}
