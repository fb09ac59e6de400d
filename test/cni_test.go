package test

import (
	"crypto/sha512"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
)

// cnitoolContainerID is the container id cnitool gives the namespace at
// netns: a hash of the path.
func cnitoolContainerID(netns string) string {
	s := sha512.Sum512([]byte(netns))
	return fmt.Sprintf("cnitool-%x", s[:10])
}

// cniLeases lists the daemon's leases of network name's attachments.
func cniLeases(t *testing.T, d *daemon, name string) []*phasegatev1.Slot {
	t.Helper()
	return cniLeasesOf(t, d.slots(), name)
}

// cniLeasesOf is cniLeases over a client the caller holds: a poll on one
// connection, not a connection each time (the control socket bounds them
// per uid).
func cniLeasesOf(t *testing.T, c phasegatev1.SlotsClient, name string) []*phasegatev1.Slot {
	t.Helper()
	var out []*phasegatev1.Slot
	for _, s := range listSlots(t, c, false) {
		if s.GetOwner() == "cni/"+name {
			out = append(out, s)
		}
	}
	return out
}

// The whole life of an attachment as a runtime drives it, with cnitool and
// the plugin `make cni-plugin` installed: ADD puts a slot's end into the
// container's namespace with its address and default route, and the host
// reaches a workload there through it; a repeated ADD answers the same;
// CHECK passes, then names what the container's root changed; DEL ends it
// and leaves the namespace (the runtime's) as it was; DEL again, and DEL
// of a namespace already gone, succeed. Every call is audited.
func TestCNIAttachmentLifeWithCnitool(t *testing.T) {
	h := newHost(t)
	addr := freePort(t)
	d := start(t, nil, h.args(addr, "--slots=64")...)
	d.waitServing(time.Minute)
	n := newCNINet(t, h.prefix+"net", d.control, nil)
	ns := containerNetns(t, "c1")
	inode := nsInode(t, ns)

	res := parseResult(t, n.mustTool("add", ns), ns)
	if got := inNetns(t, ns, "ip", "-4", "-o", "addr", "show", "dev", "eth0"); !strings.Contains(got, res.IPs[0].Address) {
		t.Fatalf("the container's eth0 does not carry %s: %s", res.IPs[0].Address, got)
	}
	if got := inNetns(t, ns, "ip", "-4", "route", "show", "default"); !strings.Contains(got, "via "+res.IPs[0].Gateway+" dev eth0") {
		t.Fatalf("no default route via %s in the container: %s", res.IPs[0].Gateway, got)
	}
	leased := cniLeases(t, d, n.name)
	if len(leased) != 1 {
		t.Fatalf("%d leases of the network, want 1", len(leased))
	}
	w := startWorkload(t, leased[0].GetIndex(), ns, res.insideAddr())
	waitFor(t, 10*time.Second, "the workload in the container to answer through the slot", func() bool { return w.ok.Load() > 0 })

	again := parseResult(t, n.mustTool("add", ns), ns)
	if again.IPs[0].Address != res.IPs[0].Address || again.Interfaces[1].Mac != res.Interfaces[1].Mac || again.Interfaces[0].Name != res.Interfaces[0].Name {
		t.Errorf("a repeated ADD answered another attachment:\n%+v\nfirst:\n%+v", again, res)
	}
	if l := cniLeases(t, d, n.name); len(l) != 1 {
		t.Errorf("a repeated ADD took another slot: %d leases", len(l))
	}
	n.mustTool("check", ns)

	// What the container's root may change is seen by CHECK, which names
	// it and repairs nothing.
	inNetns(t, ns, "ip", "route", "del", "default")
	if _, err := n.tool("check", ns); err == nil || !strings.Contains(err.Error(), "no default route via "+res.IPs[0].Gateway) {
		t.Errorf("CHECK after the default route was removed: %v, want it named", err)
	}
	inNetns(t, ns, "ip", "route", "add", "default", "via", res.IPs[0].Gateway, "dev", "eth0")

	secondNetworkBesideTheFirst(t, h, d, ns, res)

	n.mustTool("del", ns)
	if got := inNetns(t, ns, "ip", "-o", "link"); strings.Contains(got, "eth0") {
		t.Errorf("DEL left the container's end under its name: %s", got)
	}
	// DEL answers once the attachment is cut off (the name free at
	// once), and the runtime may attach the namespace again at once; the
	// pair goes with the slot's teardown, just after.
	readd := parseResult(t, n.mustTool("add", ns), ns)
	n.mustTool("del", ns)
	if readd.IPs[0].Address == "" {
		t.Errorf("an ADD right after DEL: %+v", readd)
	}
	waitFor(t, 30*time.Second, "the teardown to delete the container's end", func() bool {
		return strings.Count(inNetns(t, ns, "ip", "-o", "link"), "\n") == 1 // lo
	})
	if nsInode(t, ns) != inode {
		t.Error("DEL replaced the container's namespace")
	}
	if l := cniLeases(t, d, n.name); len(l) != 0 {
		t.Errorf("DEL left %d leases of the network", len(l))
	}
	n.mustTool("del", ns)
	gone := filepath.Join(t.TempDir(), "no-such-netns")
	if _, err := n.tool("del", gone); err != nil {
		t.Errorf("DEL of a namespace that is gone: %v", err)
	}
	for _, m := range []string{"method=CNIAdd", "method=CNIDel"} {
		if !strings.Contains(d.Output(), "msg=\"control call\" audit=true "+m+" surface=socket principal=uid:0") {
			t.Errorf("no audit line for %s", m)
		}
	}
}

// secondNetworkBesideTheFirst attaches the container in ns to a second
// network on eth1: its own slot beside the first network's (res), both
// addresses in the container, the default route the last network's; then
// it ends that attachment.
func secondNetworkBesideTheFirst(t *testing.T, h *host, d *daemon, ns string, res cniResult) {
	t.Helper()
	second := newCNINet(t, h.prefix+"two", d.control, nil)
	two := parseResult(t, second.mustTool("add", ns, "CNI_IFNAME=eth1"), ns)
	if two.IPs[0].Address == res.IPs[0].Address || two.Interfaces[1].Name != "eth1" {
		t.Errorf("a second network's ADD: %+v", two)
	}
	if got := inNetns(t, ns, "ip", "-4", "-o", "addr"); !strings.Contains(got, res.IPs[0].Address) || !strings.Contains(got, two.IPs[0].Address) {
		t.Errorf("the container does not carry both networks' addresses: %s", got)
	}
	if got := inNetns(t, ns, "ip", "-4", "route", "show", "default"); !strings.Contains(got, "dev eth1") {
		t.Errorf("the default route is not the last network's: %s", got)
	}
	second.mustTool("del", ns, "CNI_IFNAME=eth1")
}

// A runtime that passes capability args gives a container its own egress
// policy through the "egress" capability the conflist declares: it
// narrows the network's for that attachment alone (a deny-all within the
// network's allowance is taken as given), is what the lease records and
// what CHECK finds applied; a container without one gets the network's.
// That it never widens the network's: TestCNICapabilityCannotLiftTheNetworksPolicy.
func TestCNIEgressFromTheRuntimesCapability(t *testing.T) {
	h := newHost(t)
	addr := freePort(t)
	d := start(t, nil, h.args(addr)...)
	d.waitServing(time.Minute)
	n := newCNINet(t, h.prefix+"cap", d.control, map[string]any{
		"egress":       map[string]any{"allow": []string{"198.51.100.0/24"}},
		"capabilities": map[string]any{"egress": true},
	})
	own, plain := containerNetns(t, "own"), containerNetns(t, "plain")
	capArgs := `CAP_ARGS={"egress":{"allow":["192.0.2.0/24"],"denyAll":true}}`
	made := map[string]string{ // container → its address
		"own":   parseResult(t, n.mustTool("add", own, capArgs), own).IPs[0].Address,
		"plain": parseResult(t, n.mustTool("add", plain), plain).IPs[0].Address,
	}
	byNetns := map[string]*phasegatev1.Slot{}
	for _, l := range cniLeases(t, d, n.name) {
		for ns, a := range made {
			if l.GetInsideAddress() == a {
				byNetns[ns] = l
			}
		}
	}
	for _, c := range []struct {
		ns       string
		allow    string
		denyAll  bool
		checkEnv []string
	}{
		{"own", "192.0.2.0/24", true, []string{capArgs}},
		{"plain", "198.51.100.0/24", false, nil},
	} {
		l := byNetns[c.ns]
		if l == nil {
			t.Fatalf("no attachment of the %s container: %v", c.ns, byNetns)
		}
		p := l.GetEgressPolicy()
		if !slices.Equal(p.GetAllow(), []string{c.allow}) || p.GetDenyAll() != c.denyAll {
			t.Errorf("the %s container's policy: %v, want allow %s, denyAll %v", c.ns, p, c.allow, c.denyAll)
		}
	}
	n.mustTool("check", own, capArgs)
	n.mustTool("check", plain)
	n.mustTool("del", own, capArgs)
	n.mustTool("del", plain)
	if l := cniLeases(t, d, n.name); len(l) != 0 {
		t.Errorf("%d attachments left after DEL", len(l))
	}
}

// GC ends the attachments the runtime no longer knows, in one call, and
// keeps those it lists: the runtime's state is lost (cnitool's cache
// removed), and the plugin is exec'd with cni.dev/valid-attachments as a
// runtime would. Then cnitool's GC, with no attachment valid, ends the
// rest.
func TestCNIGCEndsWhatTheRuntimeForgot(t *testing.T) {
	h := newHost(t)
	addr := freePort(t)
	d := start(t, nil, h.args(addr, "--slots=64")...)
	d.waitServing(time.Minute)
	n := newCNINet(t, h.prefix+"gc", d.control, nil)
	var nss []string
	var results []cniResult
	for i := range 3 {
		ns := containerNetns(t, fmt.Sprintf("c%d", i))
		nss = append(nss, ns)
		results = append(results, parseResult(t, n.mustTool("add", ns), ns))
	}
	keep := startWorkload(t, 0, nss[0], results[0].insideAddr())
	waitFor(t, 10*time.Second, "the kept container to answer", func() bool { return keep.ok.Load() > 0 })
	n.forgetCache()

	kept := cnitoolContainerID(nss[0])
	conf := n.confWith(map[string]any{"cni.dev/valid-attachments": []map[string]string{{"containerID": kept, "ifname": "eth0"}}})
	if out, perr := n.exec("GC", conf); perr != nil {
		t.Fatalf("GC: %+v %s", perr, out)
	}
	left := cniLeases(t, d, n.name)
	if len(left) != 1 || left[0].GetRequestId() != kept+"/eth0" {
		t.Fatalf("after GC: leases %v, want %s/eth0 alone", left, kept)
	}
	for i, ns := range nss {
		has := strings.Contains(inNetns(t, ns, "ip", "-o", "link"), "eth0")
		if has != (i == 0) {
			t.Errorf("container %d has eth0: %v, want %v", i, has, i == 0)
		}
	}
	before := keep.ok.Load()
	waitFor(t, 10*time.Second, "the kept container to keep answering", func() bool { return keep.ok.Load() > before+5 })
	if !strings.Contains(d.Output(), `msg="attachments collected" network=`+n.name+" released=2 valid=1") {
		t.Error("GC did not log what it collected")
	}

	n.mustTool("gc", nss[0])
	if l := cniLeases(t, d, n.name); len(l) != 0 {
		t.Errorf("cnitool gc (nothing valid) left %d attachments", len(l))
	}
}

// Each bad input gets the spec's error code and a one-line message naming
// the problem (with its details, where the CNI library's own checks put
// them), and changes nothing: no lease, no link in the container.
func TestCNIRefusesBadInput(t *testing.T) {
	h := newHost(t)
	addr := freePort(t)
	d := start(t, nil, h.args(addr, "--slots=64")...)
	d.waitServing(time.Minute)
	n := newCNINet(t, h.prefix+"bad", d.control, nil)
	ns := containerNetns(t, "c1")
	taken := containerNetns(t, "taken")
	inNetns(t, taken, "ip", "link", "add", "eth0", "type", "veth", "peer", "name", "eth0p")
	notNs := filepath.Join(t.TempDir(), "plain-file")
	if err := os.WriteFile(notNs, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	env := func(netns string) []string {
		return []string{"CNI_CONTAINERID=bad1", "CNI_IFNAME=eth0", "CNI_NETNS=" + netns}
	}
	for _, tc := range []struct {
		name string
		conf []byte
		env  []string
		code uint
		want string
	}{
		{"malformed conflist", []byte(`{"cniVersion": "1.1.0", "name": `), env(ns), 6, "unexpected end of JSON input"},
		{"unknown cniVersion", n.confWith(map[string]any{"cniVersion": "9.9.9"}), env(ns), 1, "9.9.9"},
		{"no name", n.confWith(map[string]any{"name": nil}), env(ns), 7, "missing network name"},
		{"bad timeout", n.confWith(map[string]any{"timeout": "soon"}), env(ns), 7, "timeout"},
		{"missing CNI_NETNS", n.conf, []string{"CNI_CONTAINERID=bad1", "CNI_IFNAME=eth0"}, 4, "CNI_NETNS"},
		{"CNI_NETNS is no namespace", n.conf, env(notNs), 4, "not a namespace"},
		{"CNI_NETNS does not exist", n.conf, env(notNs + "-missing"), 3, "does not exist"},
		{"bad container id", n.conf, []string{"CNI_CONTAINERID=../x", "CNI_IFNAME=eth0", "CNI_NETNS=" + ns}, 4, "containerID"},
		{"bad ifname", n.conf, []string{"CNI_CONTAINERID=bad1", "CNI_IFNAME=much-too-long-name", "CNI_NETNS=" + ns}, 4, "interface name is too long"},
		{"ifname taken", n.conf, env(taken), 101, "has a link named eth0"},
		{"bad egress CIDR", n.confWith(map[string]any{"egress": map[string]any{"allow": []string{"10.0.0.0/33"}}}), env(ns), 7, "10.0.0.0/33"},
		{"unknown field in the egress policy", n.confWith(map[string]any{"egress": map[string]any{"alow": []string{"10.0.0.0/8"}}}), env(ns), 6, "alow"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, perr := n.exec("ADD", tc.conf, tc.env...)
			if perr == nil {
				t.Fatalf("ADD succeeded: %s", out)
			}
			said := perr.Msg + ": " + perr.Details
			if perr.Code != tc.code || !strings.Contains(said, tc.want) || strings.Contains(said, "\n") {
				t.Errorf("ADD: code %d %q, want code %d, one line naming %q", perr.Code, said, tc.code, tc.want)
			}
			if l := cniLeases(t, d, n.name); len(l) != 0 {
				t.Errorf("a refused ADD left %d leases", len(l))
			}
		})
	}
	if got := inNetns(t, ns, "ip", "-o", "link"); strings.Contains(got, "eth0") {
		t.Errorf("a refused ADD left a link in the container: %s", got)
	}
	if got := inNetns(t, taken, "ip", "-o", "link", "show", "eth0"); !strings.Contains(got, "eth0@eth0p") {
		t.Errorf("the container's own eth0 was changed: %s", got)
	}
}

// A full pool: every slot leased, an ADD gets "try again later" (11) and
// takes nothing; once an attachment ends, the same ADD succeeds.
func TestCNIFullPoolSaysTryAgainLater(t *testing.T) {
	h := newHost(t)
	addr := freePort(t)
	args := h.args(addr)
	for i, a := range args {
		if strings.HasPrefix(a, "--slots=") {
			args[i] = "--slots=2"
		}
		if strings.HasPrefix(a, "--pool-size=") {
			args[i] = "--pool-size=1"
		}
	}
	d := start(t, nil, args...)
	d.waitServing(time.Minute)
	n := newCNINet(t, h.prefix+"full", d.control, nil)
	var nss []string
	for i := range 3 {
		nss = append(nss, containerNetns(t, fmt.Sprintf("c%d", i)))
	}
	for i := range 2 {
		n.mustTool("add", nss[i])
	}
	env := []string{"CNI_CONTAINERID=full2", "CNI_IFNAME=eth0", "CNI_NETNS=" + nss[2]}
	_, perr := n.exec("ADD", n.conf, env...)
	if perr == nil || perr.Code != 11 || !strings.Contains(perr.Msg, "all 2 slots are leased") {
		t.Fatalf("ADD on a full pool: %+v, want code 11 naming the full pool", perr)
	}
	if got := inNetns(t, nss[2], "ip", "-o", "link"); strings.Contains(got, "eth0") {
		t.Errorf("a refused ADD left a link: %s", got)
	}
	n.mustTool("del", nss[0])
	if out, perr := n.exec("ADD", n.conf, env...); perr != nil {
		t.Fatalf("ADD once a slot is free: %+v", perr)
	} else {
		parseResult(t, out, nss[2])
	}
}
