package test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	cniv1 "github.com/phasegate/phasegate/api/cni/v1"
	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
)

// A container's root holds CAP_NET_ADMIN and CAP_NET_RAW in its own
// namespace: the host-side rules of an attachment are out of its reach,
// exactly as a daemon-owned slot's. From an attached container, as root
// there and as a user holding CAP_NET_RAW alone, a datagram with another
// slot's address is dropped as spoofed and never reaches the outside nor
// the victim; one from its own address to another slot, or to the host,
// is dropped too; root that flushes its namespace's tables lifts nothing
// of the egress policy its conflist gave. The victim, a daemon-owned
// slot with a workload, is untouched afterwards and answers.
func TestCNIContainerCannotSpoofReachAcrossNorLiftItsPolicy(t *testing.T) {
	nd := newNode(t)
	o := newOutside(t, nd)
	pub := newPublicDir(t)
	h, d, slots := slotsInNode(t, nd, nil, []string{"victim"}, nil)
	b := slots["victim"]
	victimAt := addrOf(t, b.GetInsideAddress(), 7200)
	victim := listenIn(t, b.GetNetnsPath(), victimAt)
	before := observeVictimIn(t, nd, d.slots(), b.GetIndex())

	open := newCNINet(t, h.prefix+"open", d.control, nil)
	// An empty policy: the daemon's always-denied set, which covers the
	// outside network here, is all it holds.
	closed := newCNINet(t, h.prefix+"closed", d.control, map[string]any{"egress": map[string]any{}})
	ctr, ctrP := containerNetns(t, "attacker"), containerNetns(t, "policied")
	own := netip.AddrPortFrom(netip.MustParseAddr(parseResult(t, open.mustTool("add", ctr), ctr).insideAddr()), 7300)
	ownP := netip.AddrPortFrom(netip.MustParseAddr(parseResult(t, closed.mustTool("add", ctrP), ctrP).insideAddr()), 7300)

	attack(t, pub.testBinary, ctr, fmt.Sprintf("udp|%s|%s|own|5", own, o.reflector), "")
	if !waitSeen(o, "own") {
		t.Fatal("the container's datagram from its own address never reached the outside: the test cannot tell a drop from a broken path")
	}
	for _, tc := range []struct{ name, caps string }{{"root in the container", ""}, {"CAP_NET_RAW alone", "net_raw"}} {
		spoofed0 := counter(t, nd, h.prefix, "spoofed")
		payload := "spoofed by " + tc.name
		attack(t, pub.testBinary, ctr, fmt.Sprintf("udp|%s|%s|%s|5", victimAt, o.reflector, payload), tc.caps)
		waitFor(t, 10*time.Second, "the spoofed datagrams counted", func() bool { return counter(t, nd, h.prefix, "spoofed") >= spoofed0+5 })
		time.Sleep(300 * time.Millisecond) // what the reflector would have answered by now
		if o.saw(payload) {
			t.Errorf("%s: a datagram with the victim's address reached the outside", tc.name)
		}
	}
	across0, host0 := counter(t, nd, h.prefix, "slot-to-slot"), counter(t, nd, h.prefix, "to-host")
	attack(t, pub.testBinary, ctr, fmt.Sprintf("udp|%s|%s|across|5", own, victimAt), "")
	attack(t, pub.testBinary, ctr, fmt.Sprintf("udp|%s|%s|host|5", own, netip.AddrPortFrom(nd.ip, 9)), "")
	waitFor(t, 10*time.Second, "the datagrams to the victim and to the host counted", func() bool {
		return counter(t, nd, h.prefix, "slot-to-slot") >= across0+5 && counter(t, nd, h.prefix, "to-host") >= host0+5
	})
	if got := victim.received(); len(got) > 0 {
		t.Errorf("the victim's workload received %d datagrams from the container, the first %q", len(got), got[0])
	}

	// Root in the container flushes what it can: its own namespace's
	// tables. The policy is on the host.
	inNetns(t, ctrP, "nft", "flush", "ruleset")
	attack(t, pub.testBinary, ctrP, fmt.Sprintf("udp|%s|%s|lifted|5", ownP, o.reflector), "")
	attack(t, pub.testBinary, ctr, fmt.Sprintf("udp|%s|%s|open|5", own, o.reflector), "")
	if !waitSeen(o, "open") {
		t.Fatal("the container without a policy no longer reaches the outside")
	}
	if o.saw("lifted") {
		t.Error("a container whose root flushed its tables went around its egress policy")
	}
	closed.mustTool("check", ctrP)
	operatorClosesEgress(t, d.slots(), o, pub, open, ctr, own)

	before.same(t, observeVictimIn(t, nd, d.slots(), b.GetIndex()), "the container's attacks")
	if !answers(t, nd, victimAt) {
		t.Error("the victim's workload no longer answers")
	}
	open.mustTool("del", ctr)
	closed.mustTool("del", ctrP)
}

// operatorClosesEgress changes the egress policy of the attachment of
// network n in the container at ctr (its workload's address own), which
// reaches the outside o, as an operator does: root finds the lease by the
// container's namespace in List, where an attachment's lease id is shown
// to those who may release it, and sets a deny-all policy with it. The
// container's next datagrams to the outside are dropped and counted,
// CHECK finds the rules the lease now records, and clearing the policy
// opens the way again.
func operatorClosesEgress(t *testing.T, c phasegatev1.SlotsClient, o *outside, pub *publicDir, n *cniNet, ctr string, own netip.AddrPort) {
	t.Helper()
	l := attachmentIn(t, c, n.name, ctr)
	if l.GetLeaseId() == "" {
		t.Fatalf("root's List shows no lease id for the attachment in %s: %v", ctr, l)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	set := func(p *phasegatev1.EgressPolicy) {
		t.Helper()
		if _, err := c.SetEgressPolicy(ctx, &phasegatev1.SetEgressPolicyRequest{Index: l.GetIndex(), LeaseId: l.GetLeaseId(), EgressPolicy: p}); err != nil {
			t.Fatalf("SetEgressPolicy of the attachment in %s: %v", ctr, err)
		}
	}
	// New source ports: a flow the old policy let through stays up.
	fresh := func(port uint16) netip.AddrPort { return netip.AddrPortFrom(own.Addr(), port) }
	set(&phasegatev1.EgressPolicy{DenyAll: true})
	attack(t, pub.testBinary, ctr, fmt.Sprintf("udp|%s|%s|closed by the operator|5", fresh(7301), o.reflector), "")
	waitFor(t, 10*time.Second, "the closed attachment's datagrams counted as dropped", func() bool {
		got, err := c.Get(ctx, &phasegatev1.GetRequest{Index: l.GetIndex()})
		return err == nil && got.GetSlot().GetEgressDroppedPackets() >= 5
	})
	if o.saw("closed by the operator") {
		t.Error("the attachment reached the outside after the operator set a deny-all policy")
	}
	n.mustTool("check", ctr)
	set(nil)
	attack(t, pub.testBinary, ctr, fmt.Sprintf("udp|%s|%s|reopened|5", fresh(7302), o.reflector), "")
	if !waitSeen(o, "reopened") {
		t.Error("the attachment does not reach the outside after its policy was cleared")
	}
}

// attachmentIn is network name's attachment in the container namespace at
// ctr, as c's List shows it.
func attachmentIn(t *testing.T, c phasegatev1.SlotsClient, name, ctr string) *phasegatev1.Slot {
	t.Helper()
	for _, l := range cniLeasesOf(t, c, name) {
		if l.GetAttachedNetnsPath() == ctr {
			return l
		}
	}
	t.Fatalf("no attachment of network %s shows namespace %s", name, ctr)
	return nil
}

// leaseIDsShownToWhoMayRelease: an attachment's lease id, which the
// runtime never sees, is shown by Get and List to root, which may attach
// for every network, and not to nobody, whom the policy lets lease (and
// read) cni/* but not attach. Given the id all the same, nobody can
// neither change the attachment's egress policy nor release it.
func leaseIDsShownToWhoMayRelease(t *testing.T, pub *publicDir, root phasegatev1.SlotsClient, sock string, victimNet *cniNet, vctr string) {
	t.Helper()
	v := attachmentIn(t, root, victimNet.name, vctr)
	if v.GetLeaseId() == "" {
		t.Fatalf("root's List shows no lease id for the victim's attachment: %v", v)
	}
	idx, S := fmt.Sprint(v.GetIndex()), "--socket="+sock
	for _, call := range [][]string{{"get", idx}, {"list"}} {
		out, code := pub.as(t, "nobody", "", append(append([]string{"slots"}, call...), S)...)
		if code != 0 || !strings.Contains(out, vctr) || strings.Contains(out, v.GetLeaseId()) {
			t.Errorf("slots %s as nobody (may read cni/*, not attach): exit %d, want the attachment without its lease id:\n%s", call[0], code, out)
		}
	}
	for _, call := range [][]string{
		{"egress", idx, v.GetLeaseId(), "--egress-allow=0.0.0.0/1,128.0.0.0/1"},
		{"release", idx, v.GetLeaseId()},
	} {
		out, code := pub.as(t, "nobody", "", append(append([]string{"slots"}, call...), S)...)
		wantRefused(t, "as nobody with the victim's lease id: "+call[0], out, code, "PermissionDenied")
	}
}

// tenantSetsItsOwnPolicy: the tenant, which attached the container at ctr
// on its network n as its own principal, sees its attachment's lease id
// and sets its egress policy with the CLI as the README shows it.
func tenantSetsItsOwnPolicy(t *testing.T, pub *publicDir, sock string, n *cniNet, ctr string) {
	t.Helper()
	out, code := pub.as(t, "daemon", "nogroup", "slots", "list", "--socket="+sock)
	var list phasegatev1.ListResponse
	if code != 0 || protojson.Unmarshal([]byte(out), &list) != nil {
		t.Fatalf("slots list as the tenant: exit %d\n%s", code, out)
	}
	var mine *phasegatev1.Slot
	for _, l := range list.GetSlots() {
		if l.GetAttachedNetnsPath() == ctr && l.GetOwner() == "cni/"+n.name {
			mine = l
		}
	}
	if mine.GetLeaseId() == "" {
		t.Fatalf("the tenant's list shows no lease id for its own attachment in %s:\n%s", ctr, out)
	}
	out, code = pub.as(t, "daemon", "nogroup", "slots", "egress", fmt.Sprint(mine.GetIndex()), mine.GetLeaseId(), "--egress-deny-all", "--socket="+sock)
	var set phasegatev1.SetEgressPolicyResponse
	if code != 0 || protojson.Unmarshal([]byte(out), &set) != nil || !set.GetSlot().GetEgressPolicy().GetDenyAll() {
		t.Errorf("slots egress --egress-deny-all as the tenant, on its own attachment: exit %d\n%s", code, out)
	}
}

// plugin runs the CNI plugin, copied into the public directory, as user
// (in group, when set), as a runtime running as that user would; it
// returns the plugin's error object, nil on success.
func (p *publicDir) plugin(t *testing.T, user, group, verb string, conf []byte, env ...string) *pluginError {
	t.Helper()
	_, perr := p.pluginOut(t, user, group, verb, conf, env...)
	return perr
}

// pluginOut is plugin that returns what the plugin printed too.
func (p *publicDir) pluginOut(t *testing.T, user, group, verb string, conf []byte, env ...string) (string, *pluginError) {
	t.Helper()
	bin := filepath.Join(p.dir, "phasegate-cni")
	copyFile(t, filepath.Join(cniPath, "phasegate-cni"), bin, 0o755)
	ra := []string{"-u", user}
	if group != "" {
		ra = append(ra, "-g", group)
	}
	cmd := exec.Command("runuser", append(ra, "--", "env", "-i")...)
	cmd.Args = append(cmd.Args, append(append([]string{"CNI_COMMAND=" + verb, "CNI_PATH=" + p.dir}, env...), bin)...)
	cmd.Stdin = bytes.NewReader(conf)
	out, err := cmd.Output()
	if err == nil {
		return string(out), nil
	}
	var pe pluginError
	if jerr := json.Unmarshal(out, &pe); jerr != nil || pe.Code == 0 {
		t.Fatalf("plugin %s as %s: %v, no error object: %q", verb, user, err, out)
	}
	return string(out), &pe
}

// cniAttack is one call of the plugin by user (in group) that must fail
// with code, its message naming want.
type cniAttack struct {
	what, user, group, verb string
	conf                    []byte
	env                     []string
	code                    uint
	want                    string
}

// cniAttackCases are TestCNIControlPlaneAttacks's calls of the plugin:
// outside the socket's group, without the grant, on the victim's network,
// into namespaces the caller cannot open (the host's, hostNetns, and a
// daemon-owned slot's, slotNetns) or cannot enter (root's container,
// public), root into the host's and the slots' (victimSlotNetns the
// attached victim's), and names outside the rules.
func cniAttackCases(tenantNet, victimNet *cniNet, victimKey []string, mine, public, hostNetns, slotNetns, victimSlotNetns string) []cniAttack {
	return []cniAttack{
		{"connect outside the socket's group", "daemon", "", "ADD", tenantNet.conf, []string{"CNI_CONTAINERID=x", "CNI_IFNAME=eth0", "CNI_NETNS=" + mine}, 5, "permission denied"},
		{"attach without the grant", "nobody", "", "ADD", tenantNet.conf, []string{"CNI_CONTAINERID=x", "CNI_IFNAME=eth0", "CNI_NETNS=" + public}, 100, "may not attach"},
		{"DEL of the victim's attachment", "nobody", "", "DEL", victimNet.conf, victimKey, 100, "may not attach"},
		{"GC of the victim's network", "nobody", "", "GC", victimNet.conf, nil, 100, "may not attach"},
		{"CHECK of the victim's attachment", "nobody", "", "CHECK", victimNet.conf, victimKey, 100, "may not attach"},
		// Namespaces the tenant cannot open: the host's (its /proc link is
		// the daemon's, root's), a slot's (in the daemon's directory).
		{"granted attach, into the host's namespace", "daemon", "nogroup", "ADD", tenantNet.conf, []string{"CNI_CONTAINERID=x", "CNI_IFNAME=eth9", "CNI_NETNS=" + hostNetns}, 4, "CNI_NETNS cannot be opened: permission denied"},
		{"granted attach, into a daemon-owned slot", "daemon", "nogroup", "ADD", tenantNet.conf, []string{"CNI_CONTAINERID=x", "CNI_IFNAME=eth9", "CNI_NETNS=" + slotNetns}, 4, "CNI_NETNS cannot be opened: permission denied"},
		// One it can open but not enter.
		{"granted attach, into root's container", "daemon", "nogroup", "ADD", tenantNet.conf, []string{"CNI_CONTAINERID=x", "CNI_IFNAME=eth9", "CNI_NETNS=" + public}, 100, "CNI_NETNS: not a network namespace uid:1 may enter"},
		// Root may enter them all: the daemon still keeps a slot to a
		// container's namespace.
		{"root, into the host's namespace", "root", "", "ADD", tenantNet.conf, []string{"CNI_CONTAINERID=x", "CNI_IFNAME=eth9", "CNI_NETNS=" + hostNetns}, 100, "the host's own namespace"},
		{"root, into a daemon-owned slot", "root", "", "ADD", tenantNet.conf, []string{"CNI_CONTAINERID=x", "CNI_IFNAME=eth9", "CNI_NETNS=" + slotNetns}, 100, "a slot's namespace"},
		{"root, into the attached victim's own slot namespace", "root", "", "ADD", tenantNet.conf, []string{"CNI_CONTAINERID=x", "CNI_IFNAME=eth9", "CNI_NETNS=" + victimSlotNetns}, 100, "own namespace"},
		{"granted attach, DEL on the victim's network", "daemon", "nogroup", "DEL", victimNet.conf, victimKey, 100, "may not attach"},
		// Names: the spec's rule for the container id and the network
		// (the plugin's own check, libcni's), and the names rule for the
		// interface name, which the lease's request id holds.
		{"granted attach, an interface name with U+3164", "daemon", "nogroup", "ADD", tenantNet.conf, []string{"CNI_CONTAINERID=x", "CNI_IFNAME=eth0\u3164", "CNI_NETNS=" + mine}, 4, `CNI_IFNAME "eth0\u3164": U+3164, outside ASCII (Lo, Hangul), at byte 4: names are`},
		{"granted attach, a container id with U+3164", "daemon", "nogroup", "ADD", tenantNet.conf, []string{"CNI_CONTAINERID=x\u3164", "CNI_IFNAME=eth0", "CNI_NETNS=" + mine}, 4, "invalid characters in containerID"},
		{"granted attach, a network name with a Cyrillic a", "daemon", "nogroup", "ADD", tenantNet.confWith(map[string]any{"name": tenantNet.name + "\u0430"}), []string{"CNI_CONTAINERID=x", "CNI_IFNAME=eth0", "CNI_NETNS=" + mine}, 7, "invalid characters found in network name"},
	}
}

// The control socket's attacks through the plugin. A user outside the
// socket's group cannot connect. A tenant the policy lets lease for the
// CNI networks, without attach, can neither attach nor end nor collect
// anyone's attachment. A tenant granted attach for its own network cannot
// open the host's namespace or a slot's, nor attach into root's container,
// which it can open but not enter, nor the host's namespace passed
// straight to the socket; root, which may enter them all, is still kept
// out of the host's and the slots'. Neither DEL nor GC of the tenant's
// network reaches another network's attachment; its own container, made
// as a rootless runtime makes one, attaches. The victims — root's
// attachment with a workload in its container, and a daemon-owned lease —
// are untouched: same records, same namespaces, both workloads answering.
func TestCNIControlPlaneAttacks(t *testing.T) {
	pub := newPublicDir(t)
	h := newHost(t)
	addr := freePort(t)
	sock := filepath.Join(pub.dir, "control.sock")
	d := start(t, nil, h.args(addr, "--slots=64", "--control-socket="+sock, "--control-group=nogroup",
		"--allow=uid:65534=cni/*", "--allow-attach=uid:1="+"cni/"+h.prefix+"tenant")...)
	d.waitServing(time.Minute)
	root := d.slots()
	victimNet := newCNINet(t, h.prefix+"victim", sock, nil)
	// Every user may open the victim's namespace, as /run/netns/<name>:
	// what refuses the attacks below is the daemon, not the file's mode.
	vctr := containerNetnsIn(t, pub.dir, "victim")
	vres := parseResult(t, victimNet.mustTool("add", vctr), vctr)
	vlease := cniLeases(t, d, victimNet.name)[0]
	vwork := startWorkload(t, vlease.GetIndex(), vctr, vres.insideAddr())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	owned, err := root.Acquire(ctx, &phasegatev1.AcquireRequest{Owner: "victim", RequestId: "sandbox-abc"})
	if err != nil {
		t.Fatal(err)
	}
	inside, _, _ := strings.Cut(owned.GetSlot().GetInsideAddress(), "/")
	owork := startWorkload(t, owned.GetSlot().GetIndex(), owned.GetSlot().GetNetnsPath(), inside)
	waitFor(t, 10*time.Second, "both victims to answer", func() bool { return vwork.ok.Load() > 0 && owork.ok.Load() > 0 })
	beforeAttached := observeVictim(t, root, vlease.GetIndex())
	beforeOwned := observeVictim(t, root, owned.GetSlot().GetIndex())
	vInode := nsInode(t, vctr)

	victimKey := []string{"CNI_CONTAINERID=" + cnitoolContainerID(vctr), "CNI_IFNAME=eth0", "CNI_NETNS=" + vctr}
	tenantNet := newCNINet(t, h.prefix+"tenant", sock, nil)
	// The tenant's own container, made as a rootless runtime makes one; and
	// one of root's that every user may open.
	mine, _ := ownNetns(t, 1, 1)
	public := containerNetnsIn(t, pub.dir, "public")
	hostNetns := fmt.Sprintf("/proc/%d/ns/net", d.Pid())
	for _, tc := range cniAttackCases(tenantNet, victimNet, victimKey, mine, public, hostNetns, owned.GetSlot().GetNetnsPath(), vlease.GetNetnsPath()) {
		perr := pub.plugin(t, tc.user, tc.group, tc.verb, tc.conf, tc.env...)
		if perr == nil || perr.Code != tc.code || !strings.Contains(perr.Msg+perr.Details, tc.want) {
			t.Errorf("%s (as %s): %+v, want code %d naming %q", tc.what, tc.user, perr, tc.code, tc.want)
		}
	}
	// Straight to the socket, the tenant passes the host's namespace,
	// which it may open as its own process's.
	if perr := pub.raw(t, "daemon", "nogroup", sock, cniv1.PathAdd, "/proc/self/ns/net",
		map[string]any{"network": tenantNet.name, "containerID": "x", "ifName": "eth9", "netns": "/proc/self/ns/net"}); perr == nil || perr.Code != 100 || !strings.Contains(perr.Msg, "not a network namespace uid:1 may enter") {
		t.Errorf("granted attach, the host's namespace passed straight to the socket: %+v, want code 100", perr)
	}
	leaseIDsShownToWhoMayRelease(t, pub, root, sock, victimNet, vctr)
	tenantsOwnNetworkReachesNoOther(t, pub, d, sock, tenantNet, victimKey, mine)
	// No lease of the Slots API is taken under a CNI network's owner, not
	// even by root: a network's keys are its ADDs' alone
	// (TestCNIKeysAndGCArePerPrincipal).
	if _, err := root.Acquire(ctx, &phasegatev1.AcquireRequest{Owner: "cni/" + tenantNet.name, RequestId: "mine/eth0"}); err == nil {
		t.Error("root's Acquire of owner cni/<network> was taken")
	}

	beforeAttached.same(t, observeVictim(t, root, vlease.GetIndex()), "the attacks on the CNI routes")
	beforeOwned.same(t, observeVictim(t, root, owned.GetSlot().GetIndex()), "the attacks on the CNI routes")
	if nsInode(t, vctr) != vInode {
		t.Error("the victim container's namespace was replaced")
	}
	victimNet.mustTool("check", vctr)
	for name, w := range map[string]*workload{"attached": vwork, "daemon-owned": owork} {
		if ok, failed, last := w.finish(); ok == 0 || failed != 0 {
			t.Errorf("the %s victim's workload: %d answered, %d failed (last: %v)", name, ok, failed, last)
		}
	}
	if !strings.Contains(d.Output(), `msg="control call refused" audit=true method=CNIDel surface=socket principal=uid:65534`) {
		t.Error("no audit line of nobody's refused DEL")
	}
	victimNet.mustTool("del", vctr)
	d.signal(syscall.SIGTERM)
	if code := d.wait(time.Minute); code != 0 {
		t.Fatalf("stop: exit %d", code)
	}
	h.decommission(h.prefix)
}

// tenantsOwnNetworkReachesNoOther checks the tenant's own network works
// (ADD, its own policy) and its DEL and GC reach nothing of the victim's,
// whose container id (in victimKey) it knows.
func tenantsOwnNetworkReachesNoOther(t *testing.T, pub *publicDir, d *daemon, sock string, tenantNet *cniNet, victimKey []string, mine string) {
	t.Helper()
	if perr := pub.plugin(t, "daemon", "nogroup", "ADD", tenantNet.conf, "CNI_CONTAINERID=mine", "CNI_IFNAME=eth0", "CNI_NETNS="+mine); perr != nil {
		t.Fatalf("the tenant's ADD on its own network: %+v", perr)
	}
	tenantSetsItsOwnPolicy(t, pub, sock, tenantNet, mine)
	if perr := pub.plugin(t, "daemon", "nogroup", "DEL", tenantNet.conf, victimKey...); perr != nil {
		t.Errorf("the tenant's DEL of an unknown key of its network: %+v", perr)
	}
	if perr := pub.plugin(t, "daemon", "nogroup", "GC", tenantNet.conf); perr != nil {
		t.Errorf("the tenant's GC of its network: %+v", perr)
	}
	if l := cniLeases(t, d, tenantNet.name); len(l) != 0 {
		t.Errorf("the tenant's GC (nothing valid) left %d of its attachments", len(l))
	}
}
