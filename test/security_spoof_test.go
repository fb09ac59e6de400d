package test

import (
	"context"
	"fmt"
	"net"
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

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
	"github.com/phasegate/phasegate/internal/rawip"
	"github.com/phasegate/phasegate/network/inside"
	"github.com/phasegate/phasegate/network/nft"
	"github.com/phasegate/phasegate/network/slot"
	"github.com/phasegate/phasegate/test/internal/microvm"
)

// Tenants reach across no more from inside their slots: run by root in a
// slot, by a process there holding CAP_NET_RAW alone (a container
// runtime's default), or by a microVM guest writing frames on its tap, a
// datagram sent with another slot's address is dropped before the host
// tracks or translates it, so the reply the outside sends never lands in
// the victim; root in a slot that flushes the tables of its namespace
// lifts nothing of its lease's egress policy, which holds on the host, and
// Get sees the flush and puts the tables back; no slot reaches the
// metadata address. The daemon runs in a namespace that plays the node,
// with an outside network behind it, so no packet leaves the test's
// namespaces and the machine's own forwarding is never touched.

// spoofEnv makes the test binary an attacker inside a slot:
// "MODE|SRC|DST|PAYLOAD|N" sends N IPv4 datagrams from SRC (a comma list:
// taken in turn) to DST, as MODE says (spoofSender): "udp" on a raw socket,
// one every 10 ms; "flood" the same, as fast as it can; "tap|…|SRCMAC|DSTMAC"
// as Ethernet frames on the slot's tap0, as its guest; "eth|…|DSTMAC" as
// frames on its eth0 (an AF_PACKET socket: past the slot's own routes);
// "arp" as ARP requests on eth0 asking for DST on behalf of SRC. It exits
// 0 once all were sent.
const spoofEnv = "PHASEGATE_TEST_SPOOF"

func init() {
	if v := os.Getenv(spoofEnv); v != "" {
		os.Exit(spoof(v))
	}
}

func spoof(spec string) int {
	f := strings.Split(spec, "|")
	if len(f) < 5 {
		fmt.Fprintf(os.Stderr, "%s=%q: want MODE|SRC|DST|PAYLOAD|N[|MAC…]\n", spoofEnv, spec)
		return 2
	}
	var srcs []netip.AddrPort
	errs := []error{}
	for _, s := range strings.Split(f[1], ",") {
		src, err := netip.ParseAddrPort(s)
		srcs, errs = append(srcs, src), append(errs, err)
	}
	dst, err2 := netip.ParseAddrPort(f[2])
	n, err3 := strconv.Atoi(f[4])
	send, done, err4 := spoofSender(f)
	if err := firstErr(append(errs, err2, err3, err4)...); err != nil {
		fmt.Fprintln(os.Stderr, "spoof:", err)
		return 2
	}
	defer done()
	for k := range n {
		if err := send(srcs[k%len(srcs)], dst, []byte(f[3])); err != nil {
			fmt.Fprintln(os.Stderr, "spoof:", err)
			return 1
		}
		if f[0] != "flood" {
			time.Sleep(10 * time.Millisecond)
		}
	}
	return 0
}

// spoofSender is how spoof's MODE (f[0]) puts a datagram from src to dst
// on the wire, and what to close after.
func spoofSender(f []string) (send func(src, dst netip.AddrPort, payload []byte) error, done func(), err error) {
	mac := func(k int) (net.HardwareAddr, error) {
		if len(f) <= k {
			return nil, fmt.Errorf("mode %s: want a MAC address in field %d", f[0], k+1)
		}
		return net.ParseMAC(f[k])
	}
	nothing := func() {}
	switch f[0] {
	case "udp", "flood":
		return func(src, dst netip.AddrPort, p []byte) error { return rawip.Send(rawip.UDP(src, dst, p)) }, nothing, nil
	case "tap":
		smac, err1 := mac(5)
		dmac, err2 := mac(6)
		if err := firstErr(err1, err2); err != nil {
			return nil, nil, err
		}
		tap, err := rawip.OpenTap("tap0")
		if err != nil {
			return nil, nil, err
		}
		return func(src, dst netip.AddrPort, p []byte) error {
			return tap.Write(rawip.Ethernet(smac, dmac, rawip.UDP(src, dst, p)))
		}, func() { tap.Close() }, nil
	case "eth", "arp":
		eth0, err := net.InterfaceByName("eth0")
		if err != nil {
			return nil, nil, err
		}
		if f[0] == "arp" {
			return func(src, dst netip.AddrPort, _ []byte) error {
				return rawip.SendFrame("eth0", rawip.ARPRequest(eth0.HardwareAddr, src.Addr(), dst.Addr()))
			}, nothing, nil
		}
		dmac, err := mac(5)
		if err != nil {
			return nil, nil, err
		}
		return func(src, dst netip.AddrPort, p []byte) error {
			return rawip.SendFrame("eth0", rawip.Ethernet(eth0.HardwareAddr, dmac, rawip.UDP(src, dst, p)))
		}, nothing, nil
	}
	return nil, nil, fmt.Errorf("mode %q: want udp, flood, tap, eth or arp", f[0])
}

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// Addresses of the outside network behind the node (TEST-NET-1, in the
// test's namespaces only) and of the metadata service there.
var (
	nodeUplink    = netip.MustParsePrefix("192.0.2.1/30")
	outsideUplink = netip.MustParsePrefix("192.0.2.2/30")
	metadataAddr  = netip.MustParseAddr("169.254.169.254")
)

// outside is a network behind the node: a namespace reached through the
// node's default route, forwarding on in the node, rp_filter off there (as
// on many hosts: the daemon must not rely on it). A reflector there echoes
// every datagram and remembers the payloads it got.
type outside struct {
	ns        string
	reflector netip.AddrPort
	mu        sync.Mutex
	got       map[string]netip.AddrPort // payload → who sent it, as seen there
}

func newOutside(t *testing.T, n *node) *outside {
	t.Helper()
	o := &outside{ns: filepath.Join(filepath.Dir(n.ns), "outside"), got: map[string]netip.AddrPort{},
		reflector: netip.AddrPortFrom(outsideUplink.Addr(), 7100)}
	if err := os.WriteFile(o.ns, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(o.ns, syscall.MNT_DETACH) })
	run(t, "unshare", "--net="+o.ns, "true")
	in := func(ns string, argv ...string) { run(t, "nsenter", append([]string{"--net=" + ns, "--"}, argv...)...) }
	in(n.ns, "ip", "link", "add", "up0", "type", "veth", "peer", "name", "eth0", "netns", o.ns)
	in(n.ns, "ip", "addr", "add", nodeUplink.String(), "dev", "up0")
	in(n.ns, "ip", "link", "set", "up0", "up")
	in(n.ns, "ip", "route", "add", "default", "via", outsideUplink.Addr().String())
	in(n.ns, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1", "net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0")
	in(o.ns, "ip", "addr", "add", outsideUplink.String(), "dev", "eth0")
	in(o.ns, "ip", "addr", "add", metadataAddr.String()+"/32", "dev", "eth0")
	in(o.ns, "ip", "link", "set", "eth0", "up")
	in(o.ns, "ip", "link", "set", "lo", "up")
	for _, at := range []netip.AddrPort{o.reflector, netip.AddrPortFrom(metadataAddr, 80)} {
		o.echo(t, at)
	}
	return o
}

// echo serves a UDP echo at addr in the outside namespace until the test
// ends, remembering every payload.
func (o *outside) echo(t *testing.T, at netip.AddrPort) {
	t.Helper()
	var c *net.UDPConn
	if err := microvm.InNamespace(o.ns, func() (err error) {
		c, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(at))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := c.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			o.mu.Lock()
			o.got[string(buf[:n])] = from
			o.mu.Unlock()
			_, _ = c.WriteToUDPAddrPort(buf[:n], from)
		}
	}()
}

// saw reports whether the outside got payload.
func (o *outside) saw(payload string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	_, ok := o.got[payload]
	return ok
}

// areYouThere is what the prober sends a victim's workload, which answers
// it and nothing else (an echo of everything would ping-pong with the
// outside's reflector).
const areYouThere = "are you there"

// victimListener is a UDP socket a workload holds in a slot's namespace:
// what a reply to a spoofed datagram would reach.
type victimListener struct {
	c   *net.UDPConn
	mu  sync.Mutex
	got []string
}

func listenIn(t *testing.T, ns string, at netip.AddrPort) *victimListener {
	t.Helper()
	v := &victimListener{}
	if err := microvm.InNamespace(ns, func() (err error) {
		network := "udp4"
		if at.Addr().Is6() {
			network = "udp6"
		}
		v.c, err = net.ListenUDP(network, net.UDPAddrFromAddrPort(at))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { v.c.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := v.c.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			if string(buf[:n]) == areYouThere {
				_, _ = v.c.WriteToUDPAddrPort(buf[:n], from) // the workload answers its prober
				continue
			}
			v.mu.Lock()
			v.got = append(v.got, string(buf[:n]))
			v.mu.Unlock()
		}
	}()
	return v
}

func (v *victimListener) received() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return append([]string(nil), v.got...)
}

// counter reads a named drop counter of the daemon's table in the node.
func counter(t *testing.T, n *node, prefix, comment string) uint64 {
	t.Helper()
	out := run(t, "nsenter", "--net="+n.ns, "--", "nft", "list", "table", "inet", nft.TableName(prefix))
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, `comment "`+comment+`"`) {
			f := strings.Fields(l[strings.Index(l, "counter packets"):])
			v, _ := strconv.ParseUint(f[2], 10, 64)
			return v
		}
	}
	t.Fatalf("no rule %q in the daemon's table:\n%s", comment, out)
	return 0
}

// attack runs the test binary in slot ns as the attacker, with spec; caps
// non-empty runs it as nobody holding only those capabilities (setpriv).
func attack(t *testing.T, bin, ns, spec string, caps string) {
	t.Helper()
	argv := []string{"--net=" + ns, "--"}
	if caps != "" {
		argv = append(argv, "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
			"--inh-caps=-all,+"+caps, "--ambient-caps=-all,+"+caps, "--bounding-set=-all,+"+caps)
	}
	cmd := exec.Command("nsenter", append(argv, bin)...)
	cmd.Env = append(os.Environ(), spoofEnv+"="+spec)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("attacker %q (caps %q): %v\n%s", spec, caps, err, out)
	}
}

// slotsInNode starts a daemon in n with extra flags and acquires one slot
// per owner, as root, with the policies given (nil: none).
func slotsInNode(t *testing.T, n *node, extra []string, owners []string, policies map[string]*phasegatev1.EgressPolicy) (*host, *daemon, map[string]*phasegatev1.Slot) {
	t.Helper()
	h := newHost(t)
	h.node = n
	addr := "127.0.0.1:5008"
	d := n.start(addr, n.command(baseEnv(), append([]string{binary}, h.args(addr, append([]string{"--slots=16"}, extra...)...)...)...))
	waitFor(t, time.Minute, "the daemon's control socket", func() bool {
		_, err := os.Stat(filepath.Join(h.stateDir, "control.sock"))
		return err == nil
	})
	d.control = filepath.Join(h.stateDir, "control.sock")
	c := d.slots()
	out := map[string]*phasegatev1.Slot{}
	for _, o := range owners {
		var resp *phasegatev1.AcquireResponse
		waitPass(t, time.Minute, "Acquire "+o, func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			var err error
			resp, err = c.Acquire(ctx, &phasegatev1.AcquireRequest{Owner: o, RequestId: o, EgressPolicy: policies[o]})
			return err
		})
		out[o] = resp.GetSlot()
	}
	return h, d, out
}

func addrOf(t *testing.T, cidr string, port uint16) netip.AddrPort {
	t.Helper()
	p, err := netip.ParsePrefix(cidr)
	if err != nil {
		t.Fatal(err)
	}
	return netip.AddrPortFrom(p.Addr(), port)
}

// waitSeen waits up to 5 s for the outside to see payload.
func waitSeen(o *outside, payload string) bool {
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if o.saw(payload) {
			return true
		}
	}
	return false
}

func TestSlotCannotSpoofNorLiftItsPolicy(t *testing.T) {
	n := newNode(t)
	o := newOutside(t, n)
	pub := newPublicDir(t)
	h, d, slots := slotsInNode(t, n, nil, []string{"attacker", "victim", "plain", "policied"},
		map[string]*phasegatev1.EgressPolicy{"policied": {}}) // the default always-denied set covers the outside
	a, b, c, p := slots["attacker"], slots["victim"], slots["plain"], slots["policied"]
	victimAt := addrOf(t, b.GetInsideAddress(), 7200)
	victim := listenIn(t, b.GetNetnsPath(), victimAt)
	before := observeVictimIn(t, n, d.slots(), b.GetIndex())

	// The path works: the attacker's own address, the same raw socket.
	attack(t, pub.testBinary, a.GetNetnsPath(), fmt.Sprintf("udp|%s|%s|own|5", addrOf(t, a.GetInsideAddress(), 7300), o.reflector), "")
	if !waitSeen(o, "own") {
		t.Fatal("the attacker's datagram from its own address never reached the outside: the test cannot tell a drop from a broken path")
	}
	attackerOut := getSlot(t, d.slots(), a.GetIndex()).GetUsage().GetPacketsOut()
	for _, tc := range []struct{ name, caps string }{{"root in the slot", ""}, {"CAP_NET_RAW alone", "net_raw"}} {
		spoofed0 := counter(t, n, h.prefix, "spoofed")
		payload := "spoofed by " + tc.name
		attack(t, pub.testBinary, a.GetNetnsPath(), fmt.Sprintf("udp|%s|%s|%s|5", victimAt, o.reflector, payload), tc.caps)
		waitFor(t, 10*time.Second, "the spoofed datagrams counted", func() bool { return counter(t, n, h.prefix, "spoofed") >= spoofed0+5 })
		time.Sleep(300 * time.Millisecond) // what the reflector would have answered by now
		if o.saw(payload) {
			t.Errorf("%s: a datagram with the victim's address reached the outside", tc.name)
		}
		if got := victim.received(); len(got) > 0 {
			t.Errorf("%s: the victim's workload received %d datagrams, the first %q", tc.name, len(got), got[0])
		}
	}

	// The spoofed datagrams are the attacker's traffic, counted on its
	// link, never the victim's.
	if got := getSlot(t, d.slots(), a.GetIndex()).GetUsage().GetPacketsOut(); got < attackerOut+10 {
		t.Errorf("the attacker's usage counts %d packets out after 10 spoofed, had %d", got, attackerOut)
	}
	if in := getSlot(t, d.slots(), b.GetIndex()).GetUsage().GetPacketsIn(); in >= before.usage.GetPacketsIn()+5 {
		t.Errorf("the victim's usage counts %d packets in, had %d: the spoofed datagrams were billed to it", in, before.usage.GetPacketsIn())
	}

	// Root in a slot flushes its namespace's tables: its policy holds on
	// the host, and Get puts the tables back.
	attackCmd := exec.Command("nsenter", "--net="+p.GetNetnsPath(), "--", "nft", "flush", "ruleset")
	if out, err := attackCmd.CombinedOutput(); err != nil {
		t.Fatalf("nft flush ruleset in the slot: %v\n%s", err, out)
	}
	attack(t, pub.testBinary, p.GetNetnsPath(), fmt.Sprintf("udp|%s|%s|lifted|5", addrOf(t, p.GetInsideAddress(), 7300), o.reflector), "")
	attack(t, pub.testBinary, c.GetNetnsPath(), fmt.Sprintf("udp|%s|%s|plain|5", addrOf(t, c.GetInsideAddress(), 7300), o.reflector), "")
	if !waitSeen(o, "plain") {
		t.Fatal("a slot without a policy does not reach the outside")
	}
	if o.saw("lifted") {
		t.Error("a slot whose root flushed its tables went around its egress policy")
	}
	got, err := d.slots().Get(context.Background(), &phasegatev1.GetRequest{Index: p.GetIndex()})
	if err != nil || !strings.Contains(strings.Join(got.GetSlot().GetRepaired(), ","), "egress policy inside (missing)") {
		t.Errorf("Get after the flush: repaired %q, %v", got.GetSlot().GetRepaired(), err)
	}
	if rules := insideRules(t, p.GetNetnsPath()); !strings.Contains(rules, "table inet phasegate_egress") {
		t.Errorf("the slot's egress table is not back after Get:\n%s", rules)
	}

	// The metadata service: no slot reaches it, policy or not.
	attack(t, pub.testBinary, c.GetNetnsPath(), fmt.Sprintf("udp|%s|%s|metadata|5", addrOf(t, c.GetInsideAddress(), 7300), netip.AddrPortFrom(metadataAddr, 80)), "")
	waitFor(t, 10*time.Second, "the metadata datagrams counted", func() bool { return counter(t, n, h.prefix, "link-local") >= 5 })
	if o.saw("metadata") {
		t.Error("a slot without a policy reached the metadata address")
	}

	// The victim is untouched: the same lease, namespace and link, and its
	// workload answers.
	before.same(t, observeVictimIn(t, n, d.slots(), b.GetIndex()), "the attacks")
	if !answers(t, n, victimAt) {
		t.Error("the victim's workload no longer answers")
	}
}

// answers reports whether a UDP echo at addr answers a datagram from the
// node.
func answers(t *testing.T, n *node, at netip.AddrPort) bool {
	t.Helper()
	var c *net.UDPConn
	if err := n.inNamespace(func() (err error) {
		c, err = net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(at))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 64)
	for range 20 {
		_, _ = c.Write([]byte(areYouThere))
		_ = c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		if k, err := c.Read(buf); err == nil && string(buf[:k]) == areYouThere {
			return true
		}
	}
	return false
}

// A microVM guest writes frames on its tap with another slot's address:
// the tap drops them inside the slot, and the host would drop them too.
// The guest's own frames go out and their replies come back to its tap.
func TestGuestCannotSpoof(t *testing.T) {
	n := newNode(t)
	o := newOutside(t, n)
	pub := newPublicDir(t)
	_, d, slots := slotsInNode(t, n, e2eGuest, []string{"attacker", "victim"}, nil)
	a, b := slots["attacker"], slots["victim"]
	guest := netip.MustParsePrefix("169.254.255.21/30").Addr()
	guestMAC := "02:fc:00:00:00:01"
	frames := func(from netip.AddrPort, payload string) string {
		return fmt.Sprintf("tap|%s|%s|%s|5|%s|%s", from, o.reflector, payload, guestMAC, slot.TapMAC(int(a.GetIndex())))
	}
	before := observeVictimIn(t, n, d.slots(), b.GetIndex())
	attack(t, pub.testBinary, a.GetNetnsPath(), frames(netip.AddrPortFrom(guest, 7300), "guest own"), "")
	if !waitSeen(o, "guest own") {
		t.Fatal("the guest's own frame never reached the outside: the test cannot tell a drop from a broken path")
	}
	for _, src := range []netip.AddrPort{addrOf(t, b.GetInsideAddress(), 7200), netip.AddrPortFrom(netip.MustParseAddr("169.254.255.23"), 7200)} {
		payload := "guest spoofing " + src.String()
		attack(t, pub.testBinary, a.GetNetnsPath(), frames(src, payload), "")
		time.Sleep(300 * time.Millisecond)
		if o.saw(payload) {
			t.Errorf("a frame from the guest with source %s reached the outside", src)
		}
	}
	if rules := insideRules(t, a.GetNetnsPath()); !strings.Contains(rules, "chain tap") {
		t.Errorf("the attacker's slot has no tap filter:\n%s", rules)
	}

	// The guest network is IPv4: the guest's IPv6 reaches nothing in the
	// slot, not even its all-nodes group, which every IPv6 link joins.
	// The same datagram arrives once the tap filter's IPv6 table is gone:
	// what dropped it was the filter.
	l6 := listenIn(t, a.GetNetnsPath(), netip.MustParseAddrPort("[::]:7400"))
	v6 := func(payload string) string {
		return fmt.Sprintf("tap|[fe80::fc:ff:fe00:1]:7301|[ff02::1]:7400|%s|5|%s|33:33:00:00:00:01", payload, guestMAC)
	}
	attack(t, pub.testBinary, a.GetNetnsPath(), v6("guest v6 filtered"), "")
	time.Sleep(300 * time.Millisecond)
	if got := l6.received(); len(got) != 0 {
		t.Errorf("the guest's IPv6 to ff02::1 reached a socket in the slot: %q", got)
	}
	run(t, "nsenter", "--net="+a.GetNetnsPath(), "--", "nft", "delete", "table", "ip6", inside.GuestTable)
	attack(t, pub.testBinary, a.GetNetnsPath(), v6("guest v6 unfiltered"), "")
	waitFor(t, 5*time.Second, "the guest's IPv6 datagram once the tap filter's IPv6 table is gone (else the test cannot tell a drop from a broken path)",
		func() bool { return slices.Contains(l6.received(), "guest v6 unfiltered") })
	before.same(t, observeVictimIn(t, n, d.slots(), b.GetIndex()), "the guest's frames")
}
