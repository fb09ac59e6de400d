package test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
	"github.com/phasegate/phasegate/network/leases"
)

// netnsOfUser makes a network namespace in a user namespace that uid
// owns, as a rootless runtime of that user would, held by a process until
// the test ends; it returns the namespace's path under /proc. The process
// creates it as uid keeping CAP_SYS_ADMIN, so that no host setting about
// unprivileged user namespaces decides whether the test runs.
func netnsOfUser(t *testing.T, uid int) string {
	t.Helper()
	id := fmt.Sprint(uid)
	cmd := exec.Command("setpriv", "--reuid="+id, "--regid="+id, "--clear-groups",
		"--inh-caps=-all,+sys_admin", "--ambient-caps=-all,+sys_admin", "--",
		"unshare", "--user", "--net", "--", "sleep", "infinity")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	path := fmt.Sprintf("/proc/%d/ns/net", cmd.Process.Pid)
	self, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the user's namespace", func() bool {
		ns, err := os.Readlink(path)
		return err == nil && ns != self
	})
	return path
}

// defaultRoute is the default route of the namespace at path, as ip shows
// it.
func defaultRoute(t *testing.T, path string) string {
	t.Helper()
	return strings.TrimSpace(inNetns(t, path, "ip", "-4", "route", "show", "default"))
}

// A CNI key belongs to its network's attach, and an attachment to its
// principal, on a daemon started as the host was:
//
//   - uid 1, which the policy lets lease cni/*, cannot take a key of root's
//     network through the Slots API, whatever its request id: root's ADD,
//     DEL and GC of that container then work. Root itself cannot either.
//   - Leases of the Slots API recorded under a network's owner by a build
//     before the rule (uid 1's, rewritten in the store as such a build
//     wrote them) survive a restart: listed, renewed and released by their
//     principal; root's ADD of a key one holds fails naming uid 1 and the
//     DEL that ends it, and root's DEL does.
//   - nobody, granted attach for its own network, neither ends root's
//     attachment on that network by DEL (refused, naming uid:0) nor by a GC
//     whose valid list leaves it out: the GC ends nobody's own attachment
//     and keeps root's, whose record, slot namespace and host link, its
//     container's namespace and default route are as they were, its
//     workload answering throughout. Root's GC ends it.
func TestCNIKeysAndGCArePerPrincipal(t *testing.T) {
	pub := newPublicDir(t)
	h := newHost(t)
	addr := freePort(t)
	sock := filepath.Join(pub.dir, "control.sock")
	args := h.args(addr, "--slots=64", "--control-socket="+sock, "--control-group=nogroup",
		"--allow=user:nobody=nb-*", "--allow-attach=user:nobody=cni/"+h.prefix+"nb", "--allow=uid:1=cni/*")
	d := start(t, nil, args...)
	d.waitServing(time.Minute)
	root := d.slots()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rt := newCNINet(t, h.prefix+"rt", sock, nil)
	nb := newCNINet(t, h.prefix+"nb", sock, nil)
	S := "--socket=" + sock
	key := func(id, netns string) []string {
		return []string{"CNI_CONTAINERID=" + id, "CNI_IFNAME=eth0", "CNI_NETNS=" + netns}
	}

	// The squat, through the Slots API, as uid 1 and as root.
	for _, owner := range []string{"cni/" + rt.name, "cni/" + nb.name} {
		for _, req := range []string{"--request-id=future/eth0", "--request-id=x"} {
			out, code := pub.as(t, "daemon", "nogroup", "slots", "acquire", owner, req, S)
			wantRefused(t, "acquire "+owner+" "+req+" as uid 1", out, code, "PermissionDenied")
			if !strings.Contains(out, "made only by the CNI plugin's ADD") {
				t.Errorf("acquire %s as uid 1: %q, want the refusal to say who makes such leases", owner, out)
			}
		}
	}
	if _, err := root.Acquire(ctx, &phasegatev1.AcquireRequest{Owner: "cni/" + rt.name, RequestId: "future/eth0"}); err == nil {
		t.Error("root's Acquire of owner cni/<network> was taken")
	}
	if l := cniLeases(t, d, rt.name); len(l) != 0 {
		t.Fatalf("leases of root's network after the squats: %v", l)
	}
	future := containerNetns(t, "future")
	if perr := pub.plugin(t, "root", "", "ADD", rt.conf, key("future", future)...); perr != nil {
		t.Fatalf("root's ADD of container future after the squat: %+v", perr)
	}
	if perr := pub.plugin(t, "root", "", "DEL", rt.conf, key("future", future)...); perr != nil {
		t.Fatalf("root's DEL of container future: %+v", perr)
	}
	if perr := pub.plugin(t, "root", "", "GC", rt.conf); perr != nil {
		t.Fatalf("root's GC of its network: %+v", perr)
	}
	if l := cniLeases(t, d, rt.name); len(l) != 0 {
		t.Fatalf("leases of root's network after its DEL and GC: %v", l)
	}

	// Squats recorded before the rule: two leases rewritten in the store
	// as uid 1's under root's network, one of them at a key.
	legacy := map[string]*phasegatev1.AcquireResponse{}
	for _, rq := range []string{"future2/eth0", "old-1"} {
		a, err := root.Acquire(ctx, &phasegatev1.AcquireRequest{Owner: "legacy", RequestId: rq})
		if err != nil {
			t.Fatal(err)
		}
		legacy[rq] = a
	}
	d.signal(syscall.SIGTERM)
	if code := d.wait(time.Minute); code != 0 {
		t.Fatalf("stop: exit %d", code)
	}
	st, err := leases.Open(filepath.Join(h.stateDir, "slots.db"), leases.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range legacy {
		if _, err := st.Update(ctx, int(a.GetSlot().GetIndex()), func(r *leases.Record) error {
			r.Owner, r.Principal = "cni/"+rt.name, "uid:1"
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	st.Close()
	d = start(t, nil, args...)
	d.waitServing(time.Minute)
	root = d.slots()
	out, code := pub.as(t, "daemon", "nogroup", "slots", "list", S)
	if code != 0 || !strings.Contains(out, `"future2/eth0"`) || !strings.Contains(out, `"old-1"`) {
		t.Errorf("slots list as uid 1 after the restart: exit %d, want both of its old leases:\n%s", code, out)
	}
	old := legacy["old-1"]
	I := fmt.Sprint(old.GetSlot().GetIndex())
	for _, verb := range []string{"keepalive", "release"} {
		if out, code := pub.as(t, "daemon", "nogroup", "slots", verb, I, old.GetLeaseId(), S); code != 0 {
			t.Errorf("%s of its old lease by uid 1: exit %d %s", verb, code, out)
		}
	}
	future2 := containerNetns(t, "future2")
	perr := pub.plugin(t, "root", "", "ADD", rt.conf, key("future2", future2)...)
	if perr == nil || perr.Code != 100 || !strings.Contains(perr.Msg, "a lease of the Slots API of uid:1") || !strings.Contains(perr.Msg, "a DEL of the key") {
		t.Fatalf("root's ADD of a key an old lease of uid 1 holds: %+v, want code 100 naming uid:1 and the DEL", perr)
	}
	if perr := pub.plugin(t, "root", "", "DEL", rt.conf, key("future2", future2)...); perr != nil {
		t.Fatalf("root's DEL of the squatted key: %+v", perr)
	}
	sq := legacy["future2/eth0"]
	out, code = pub.as(t, "daemon", "nogroup", "slots", "release", fmt.Sprint(sq.GetSlot().GetIndex()), sq.GetLeaseId(), S)
	wantRefused(t, "uid 1's release of its squat after root's DEL", out, code, "FailedPrecondition")
	if perr := pub.plugin(t, "root", "", "ADD", rt.conf, key("future2", future2)...); perr != nil {
		t.Fatalf("root's ADD after its DEL of the squat: %+v", perr)
	}
	if perr := pub.plugin(t, "root", "", "DEL", rt.conf, key("future2", future2)...); perr != nil {
		t.Fatal(perr)
	}
	if !strings.Contains(d.Output(), `a lease of the Slots API held a CNI key: DEL ends it`) {
		t.Error("no log line of the squat DEL ended")
	}

	// Root's attachment on nobody's network, and nobody's own.
	victim := containerNetns(t, "victim")
	vres := parseResult(t, nb.mustTool("add", victim), victim)
	vlease := attachmentIn(t, root, nb.name, victim)
	vwork := startWorkload(t, vlease.GetIndex(), victim, vres.insideAddr())
	waitFor(t, 10*time.Second, "the victim to answer", func() bool { return vwork.ok.Load() > 0 })
	before, vInode, vRoute := observeVictim(t, root, vlease.GetIndex()), nsInode(t, victim), defaultRoute(t, victim)
	if !strings.HasPrefix(vRoute, "default via") {
		t.Fatalf("the victim's default route: %q", vRoute)
	}
	mine := netnsOfUser(t, 65534)
	if perr := pub.plugin(t, "nobody", "", "ADD", nb.conf, key("mine", mine)...); perr != nil {
		t.Fatalf("nobody's ADD on its own network into its own namespace: %+v", perr)
	}
	vkey := key(cnitoolContainerID(victim), victim)
	perr = pub.plugin(t, "nobody", "", "DEL", nb.conf, vkey...)
	if perr == nil || perr.Code != 100 || !strings.Contains(perr.Msg, "uid:0's attachment: only uid:0 or root may end it") {
		t.Errorf("nobody's DEL of root's attachment on nobody's network: %+v, want code 100 naming uid:0", perr)
	}
	valid := []map[string]string{{"containerID": "gone", "ifname": "eth0"}} // a valid list, without root's
	if perr := pub.plugin(t, "nobody", "", "GC", nb.confWith(map[string]any{"cni.dev/valid-attachments": valid})); perr != nil {
		t.Fatalf("nobody's GC of its network: %+v", perr)
	}
	left := cniLeases(t, d, nb.name)
	if len(left) != 1 || left[0].GetAttachedNetnsPath() != victim {
		t.Errorf("nobody's network after nobody's GC: %v, want root's attachment alone", left)
	}
	before.same(t, observeVictim(t, root, vlease.GetIndex()), "nobody's DEL and GC")
	if nsInode(t, victim) != vInode {
		t.Error("the victim container's namespace was replaced")
	}
	if got := defaultRoute(t, victim); got != vRoute {
		t.Errorf("the victim's default route after nobody's DEL and GC: %q, was %q", got, vRoute)
	}
	nb.mustTool("check", victim)
	if ok, failed, last := vwork.finish(); ok == 0 || failed != 0 {
		t.Errorf("the victim's workload: %d answered, %d failed (last: %v)", ok, failed, last)
	}
	logs := d.Output()
	for _, want := range []string{
		`method=CNIGC surface=socket principal=uid:65534`,
		`released=1 kept=1 kept_by=uid:0`,
		`msg="control call refused" audit=true method=CNIDel surface=socket principal=uid:65534`,
	} {
		if !strings.Contains(logs, want) {
			t.Errorf("no audit line with %s", want)
		}
	}

	// Root's GC ends every attachment of the network.
	if perr := pub.plugin(t, "root", "", "GC", nb.conf); perr != nil {
		t.Fatalf("root's GC of nobody's network: %+v", perr)
	}
	if l := cniLeases(t, d, nb.name); len(l) != 0 {
		t.Errorf("nobody's network after root's GC: %v", l)
	}
	d.signal(syscall.SIGTERM)
	if code := d.wait(time.Minute); code != 0 {
		t.Fatalf("stop: exit %d", code)
	}
	h.decommission(h.prefix)
}
