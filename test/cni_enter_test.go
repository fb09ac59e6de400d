package test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	cniv1 "github.com/phasegate/phasegate/api/cni/v1"
)

// enterRefusal is what the daemon answers a caller other than root for a
// namespace it will not act on, whatever the reason.
const enterRefusal = "CNI_NETNS: not a network namespace uid:65534 may enter"

// The confused deputy of issue 49 (finding 1). nobody, granted attach for
// its own network only, names root's container namespace — bound at a file
// every user may open, as /run/netns/<name> is — through the plugin,
// straight on the socket by path, and passing the namespace it opened
// itself; it passes the host's; it swaps a path it owns between its own
// namespace and the victim's while it attaches; and it CHECKs its own
// attachment against the victim's namespace. Every one is refused with
// the same answer, and the victim — root's attachment with a workload in
// its container — is untouched: the same namespace, links, addresses and
// default route, the same lease, its workload answering throughout.
// nobody's own namespace, which it made in a user namespace of its own as
// a rootless runtime does, attaches, CHECKs and DELs.
func TestCNIAttachOnlyWhereTheCallerMayEnter(t *testing.T) {
	pub := newPublicDir(t)
	h := newHost(t)
	addr := freePort(t)
	sock := filepath.Join(pub.dir, "control.sock")
	nbNet := h.prefix + "nb"
	d := start(t, nil, h.args(addr, "--slots=64", "--control-socket="+sock, "--control-group=nogroup",
		"--allow=uid:65534=nb-*", "--allow-attach=uid:65534=cni/"+nbNet)...)
	d.waitServing(time.Minute)
	root := d.slots()
	victimNet := newCNINet(t, h.prefix+"victim", sock, nil)
	vctr := containerNetnsIn(t, pub.dir, "rtc1")
	vres := parseResult(t, victimNet.mustTool("add", vctr), vctr)
	vlease := cniLeases(t, d, victimNet.name)[0]
	vwork := startWorkload(t, vlease.GetIndex(), vctr, vres.insideAddr())
	waitFor(t, 10*time.Second, "the victim's workload to answer", func() bool { return vwork.ok.Load() > 0 })
	beforeLease := observeVictim(t, root, vlease.GetIndex())
	before := observeContainer(t, vctr)
	if !strings.Contains(before.routes, "default via "+vres.IPs[0].Gateway) {
		t.Fatalf("the victim's default route is not its attachment's: %s", before.routes)
	}

	nb := newCNINet(t, nbNet, sock, nil)
	own, ownPid := ownNetns(t, 65534, 65534)
	e := enterAttack{pub: pub, nb: nb, sock: sock, victim: vctr, own: own, ownPid: ownPid}
	e.namingTheVictimRefused(t)
	e.swappedPathActsOnTheChecked(t)
	e.ownNamespaceAttaches(t)

	before.same(t, observeContainer(t, vctr), "nobody's attacks")
	beforeLease.same(t, observeVictim(t, root, vlease.GetIndex()), "nobody's attacks")
	if ok, failed, last := vwork.finish(); ok == 0 || failed != 0 {
		t.Errorf("the victim's workload: %d answered, %d failed (last: %v)", ok, failed, last)
	}
	if l := cniLeases(t, d, nbNet); len(l) != 0 {
		t.Errorf("nobody's network holds %d attachments after its DELs and GC", len(l))
	}
	if !strings.Contains(d.Output(), `method=CNIAdd surface=socket principal=uid:65534`) || !strings.Contains(d.Output(), "netns_refused=") {
		t.Error("no audit line of nobody's refused ADD with why it was refused")
	}
	victimNet.mustTool("del", vctr)
}

// enterAttack is nobody's side of TestCNIAttachOnlyWhereTheCallerMayEnter:
// its network nb on the control socket, the victim's container namespace
// (bound at a path every user may open), and the namespace nobody made
// itself (own, held by ownPid).
type enterAttack struct {
	pub    *publicDir
	nb     *cniNet
	sock   string
	victim string
	own    string
	ownPid int
}

// add is the body of an ADD straight on the socket: container id into
// namespace netns, on nobody's network.
func (e enterAttack) add(id, netns string) map[string]any {
	return map[string]any{"network": e.nb.name, "containerID": id, "ifName": "eth1", "netns": netns}
}

// cniKeyIf is the CNI key of a container's interface ifName in namespace
// netns, as the runtime's environment names it.
func cniKeyIf(ifName, id, netns string) []string {
	return []string{"CNI_CONTAINERID=" + id, "CNI_IFNAME=" + ifName, "CNI_NETNS=" + netns}
}

// namingTheVictimRefused names the victim's namespace (or the host's, or
// a file) through the plugin and straight on the socket, by path and
// passed open: every one refused with the same answer.
func (e enterAttack) namingTheVictimRefused(t *testing.T) {
	t.Helper()
	for _, tc := range []struct {
		what string
		err  func() *pluginError
	}{
		{"the plugin, the victim's namespace", func() *pluginError {
			return e.pub.plugin(t, "nobody", "", "ADD", e.nb.conf, cniKeyIf("eth1", "a1", e.victim)...)
		}},
		{"straight to the socket, the victim's path, nothing passed", func() *pluginError {
			return e.pub.raw(t, "nobody", "", e.sock, cniv1.PathAdd, "", e.add("a2", e.victim))
		}},
		{"straight to the socket, the victim's namespace passed", func() *pluginError {
			return e.pub.raw(t, "nobody", "", e.sock, cniv1.PathAdd, e.victim, e.add("a3", e.victim))
		}},
		{"straight to the socket, the victim's namespace passed, its own path named", func() *pluginError {
			return e.pub.raw(t, "nobody", "", e.sock, cniv1.PathAdd, e.victim, e.add("a4", e.own))
		}},
		{"straight to the socket, the host's namespace passed", func() *pluginError {
			return e.pub.raw(t, "nobody", "", e.sock, cniv1.PathAdd, "/proc/self/ns/net", e.add("a5", "/proc/self/ns/net"))
		}},
		{"straight to the socket, a file passed", func() *pluginError {
			return e.pub.raw(t, "nobody", "", e.sock, cniv1.PathAdd, e.pub.binary, e.add("a6", e.own))
		}},
	} {
		if perr := tc.err(); perr == nil || perr.Code != cniv1.CodeRefused || perr.Msg+perr.Details != refusalMsg() {
			t.Errorf("%s: %+v, want code 100: %q", tc.what, perr, refusalMsg())
		}
	}
}

// swappedPathActsOnTheChecked attaches through a path nobody owns,
// swapped between its own namespace and the victim's meanwhile: whichever
// it names, the daemon acts on the namespace it checked, so nobody's
// namespace holds exactly what was attached.
func (e enterAttack) swappedPathActsOnTheChecked(t *testing.T) {
	t.Helper()
	swapDir := filepath.Join(e.pub.dir, "swap")
	if err := os.Mkdir(swapDir, 0o755); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(swapDir, "ctr")
	var stop atomic.Bool
	var swaps sync.WaitGroup
	swaps.Go(func() {
		for i := 0; !stop.Load(); i++ {
			target := e.own
			if i%2 == 1 {
				target = e.victim
			}
			tmp := filepath.Join(swapDir, "next")
			_ = os.Remove(tmp)
			if err := os.Symlink(target, tmp); err == nil {
				_ = os.Rename(tmp, link)
			}
		}
	})
	var attached, refused []string
	for i := range 24 {
		id := fmt.Sprintf("swap%d", i)
		perr := e.pub.plugin(t, "nobody", "", "ADD", e.nb.confWith(map[string]any{"timeout": "20s"}), "CNI_CONTAINERID="+id, fmt.Sprintf("CNI_IFNAME=s%d", i), "CNI_NETNS="+link)
		switch {
		case perr == nil:
			attached = append(attached, fmt.Sprintf("s%d", i))
		case perr.Code == cniv1.CodeRefused && perr.Msg == refusalMsg():
			refused = append(refused, id)
		default:
			t.Errorf("ADD %d through the swapped path: %+v", i, perr)
		}
	}
	stop.Store(true)
	swaps.Wait()
	t.Logf("through the swapped path: %d attached (into nobody's own namespace), %d refused", len(attached), len(refused))
	if got := linksIn(t, e.ownPid); strings.Join(got, " ") != strings.Join(attached, " ") {
		t.Errorf("nobody's namespace holds %v, want the %d attached through the swapped path %v", got, len(attached), attached)
	}
	if perr := e.pub.plugin(t, "nobody", "", "GC", e.nb.conf); perr != nil {
		t.Fatalf("nobody's GC of its network: %+v", perr)
	}
}

// ownNamespaceAttaches checks nobody's own namespace attaches, CHECKs and
// DELs, and a CHECK naming the victim's is refused as ADD is.
func (e enterAttack) ownNamespaceAttaches(t *testing.T) {
	t.Helper()
	out, perr := e.pub.pluginOut(t, "nobody", "", "ADD", e.nb.conf, cniKeyIf("eth1", "mine", e.own)...)
	if perr != nil {
		t.Fatalf("nobody's ADD into the namespace it owns: %+v", perr)
	}
	mine := parseResult(t, out, e.own)
	if got := run(t, "nsenter", "-t", fmt.Sprint(e.ownPid), "-n", "--", "ip", "-br", "-4", "addr", "show", "eth1"); !strings.Contains(got, mine.IPs[0].Address) {
		t.Errorf("nobody's namespace after its ADD: %q, want eth1 with %s", got, mine.IPs[0].Address)
	}
	if perr := e.pub.plugin(t, "nobody", "", "CHECK", e.nb.conf, cniKeyIf("eth1", "mine", e.own)...); perr != nil {
		t.Errorf("nobody's CHECK of its own attachment: %+v", perr)
	}
	if perr := e.pub.plugin(t, "nobody", "", "CHECK", e.nb.conf, cniKeyIf("eth1", "mine", e.victim)...); perr == nil || perr.Code != cniv1.CodeRefused || perr.Msg != refusalMsg() {
		t.Errorf("nobody's CHECK of its attachment naming the victim's namespace: %+v, want code 100: %q", perr, refusalMsg())
	}
	if perr := e.pub.plugin(t, "nobody", "", "DEL", e.nb.conf, cniKeyIf("eth1", "mine", e.own)...); perr != nil {
		t.Errorf("nobody's DEL of its own attachment: %+v", perr)
	}
	// DEL cuts the attachment off at once; the pool's teardown deletes
	// the pair, the container's end with it.
	waitFor(t, 10*time.Second, "the end of nobody's attachment gone from its namespace", func() bool { return len(linksIn(t, e.ownPid)) == 0 })
}

// refusalMsg is the daemon's whole message for enterRefusal.
func refusalMsg() string {
	return enterRefusal + ": a caller other than root passes the namespace open (phasegate-cni does), and must be able to setns(2) into it (own the user namespace that owns it, or hold CAP_SYS_ADMIN there)"
}

// No file-existence oracle (finding 7). Through the plugin and straight to
// the socket, nobody, granted attach, names a regular file, a missing one
// and a namespace, all in a directory only root may search (/root's 0700,
// here a test's own): each way, the three answers are the same, byte for
// byte. The plugin opens CNI_NETNS with nobody's credentials, and the
// daemon opens no path for it.
func TestCNINoFileExistenceOracle(t *testing.T) {
	pub := newPublicDir(t)
	h := newHost(t)
	addr := freePort(t)
	sock := filepath.Join(pub.dir, "control.sock")
	nbNet := h.prefix + "nb"
	d := start(t, nil, h.args(addr, "--slots=16", "--control-socket="+sock, "--control-group=nogroup",
		"--allow-attach=uid:65534=cni/"+nbNet)...)
	d.waitServing(time.Minute)
	private, err := os.MkdirTemp("", "phasegate-root-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(private) })
	if err := os.Chmod(private, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(private, ".bashrc"), []byte("# root's\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	paths := []string{filepath.Join(private, ".bashrc"), filepath.Join(private, "nonexistent"), containerNetnsIn(t, private, "ns")}
	if st, err := os.Stat("/root"); err == nil && st.Mode().Perm()&0o005 == 0 {
		paths = append(paths, "/root/.bashrc", "/root/nonexistent")
	}
	nb := newCNINet(t, nbNet, sock, nil)
	for _, way := range []struct {
		name string
		call func(path string) string
	}{
		{"the plugin", func(path string) string {
			out, _ := pub.pluginOut(t, "nobody", "", "ADD", nb.conf, "CNI_CONTAINERID=x", "CNI_IFNAME=eth0", "CNI_NETNS="+path)
			return out
		}},
		{"straight to the socket", func(path string) string {
			perr := pub.raw(t, "nobody", "", sock, cniv1.PathAdd, "", map[string]any{"network": nbNet, "containerID": "x", "ifName": "eth0", "netns": path})
			return fmt.Sprintf("%+v", perr)
		}},
	} {
		first := way.call(paths[0])
		if !strings.Contains(first, `"code"`) && !strings.Contains(first, "Code:") {
			t.Fatalf("%s, %s: %q, want an error", way.name, paths[0], first)
		}
		for _, p := range paths[1:] {
			if got := way.call(p); got != first {
				t.Errorf("%s: %s answered %q, %s %q: an oracle of what nobody cannot see", way.name, paths[0], first, p, got)
			}
		}
		t.Logf("%s: every path: %s", way.name, strings.Join(strings.Fields(first), " "))
	}
	if l := cniLeases(t, d, nbNet); len(l) != 0 {
		t.Errorf("%d attachments made", len(l))
	}
}
