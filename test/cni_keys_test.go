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
	r := &cniKeysRig{pub: pub, h: h, S: "--socket=" + sock}
	r.args = h.args(addr, "--slots=64", "--control-socket="+sock, "--control-group=nogroup",
		"--allow=user:nobody=nb-*", "--allow-attach=user:nobody=cni/"+h.prefix+"nb", "--allow=uid:1=cni/*")
	r.start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	r.rt = newCNINet(t, h.prefix+"rt", sock, nil)
	r.nb = newCNINet(t, h.prefix+"nb", sock, nil)

	r.squatsThroughTheSlotsAPIRefused(t, ctx)
	r.squatsOfOldBuildsEndedByDEL(t, ctx)
	r.nobodyLeavesRootsAttachment(t)

	// Root's GC ends every attachment of the network.
	if perr := pub.plugin(t, "root", "", "GC", r.nb.conf); perr != nil {
		t.Fatalf("root's GC of nobody's network: %+v", perr)
	}
	if l := cniLeases(t, r.d, r.nb.name); len(l) != 0 {
		t.Errorf("nobody's network after root's GC: %v", l)
	}
	r.d.signal(syscall.SIGTERM)
	if code := r.d.wait(time.Minute); code != 0 {
		t.Fatalf("stop: exit %d", code)
	}
	h.decommission(h.prefix)
}

// cniKeysRig is TestCNIKeysAndGCArePerPrincipal's daemon (started with
// args, restarted once) on a control socket (S, its flag), root's network
// rt and nobody's network nb.
type cniKeysRig struct {
	pub    *publicDir
	h      *host
	args   []string
	S      string
	d      *daemon
	root   phasegatev1.SlotsClient
	rt, nb *cniNet
}

// start starts the daemon with the rig's args and waits until it serves.
func (r *cniKeysRig) start(t *testing.T) {
	t.Helper()
	r.d = start(t, nil, r.args...)
	r.d.waitServing(time.Minute)
	r.root = r.d.slots()
}

// cniKey is the CNI key of a container's eth0 in namespace netns, as the
// runtime's environment names it.
func cniKey(id, netns string) []string { return cniKeyIf("eth0", id, netns) }

// squatsThroughTheSlotsAPIRefused checks that neither uid 1 nor root can
// take a key of root's network through the Slots API, whatever the
// request id, and that root's ADD, DEL and GC of that container then work.
func (r *cniKeysRig) squatsThroughTheSlotsAPIRefused(t *testing.T, ctx context.Context) {
	t.Helper()
	// The squat, through the Slots API, as uid 1 and as root.
	for _, owner := range []string{"cni/" + r.rt.name, "cni/" + r.nb.name} {
		for _, req := range []string{"--request-id=future/eth0", "--request-id=x"} {
			out, code := r.pub.as(t, "daemon", "nogroup", "slots", "acquire", owner, req, r.S)
			wantRefused(t, "acquire "+owner+" "+req+" as uid 1", out, code, "PermissionDenied")
			if !strings.Contains(out, "made only by the CNI plugin's ADD") {
				t.Errorf("acquire %s as uid 1: %q, want the refusal to say who makes such leases", owner, out)
			}
		}
	}
	if _, err := r.root.Acquire(ctx, &phasegatev1.AcquireRequest{Owner: "cni/" + r.rt.name, RequestId: "future/eth0"}); err == nil {
		t.Error("root's Acquire of owner cni/<network> was taken")
	}
	if l := cniLeases(t, r.d, r.rt.name); len(l) != 0 {
		t.Fatalf("leases of root's network after the squats: %v", l)
	}
	future := containerNetns(t, "future")
	if perr := r.pub.plugin(t, "root", "", "ADD", r.rt.conf, cniKey("future", future)...); perr != nil {
		t.Fatalf("root's ADD of container future after the squat: %+v", perr)
	}
	if perr := r.pub.plugin(t, "root", "", "DEL", r.rt.conf, cniKey("future", future)...); perr != nil {
		t.Fatalf("root's DEL of container future: %+v", perr)
	}
	if perr := r.pub.plugin(t, "root", "", "GC", r.rt.conf); perr != nil {
		t.Fatalf("root's GC of its network: %+v", perr)
	}
	if l := cniLeases(t, r.d, r.rt.name); len(l) != 0 {
		t.Fatalf("leases of root's network after its DEL and GC: %v", l)
	}
}

// squatsOfOldBuildsEndedByDEL rewrites two of root's leases in the store
// as a build before the rule wrote uid 1's under root's network (one at a
// key), restarts the daemon, and checks uid 1 still lists, renews and
// releases them, root's ADD of the held key fails naming uid 1 and the
// DEL, and root's DEL ends the squat.
func (r *cniKeysRig) squatsOfOldBuildsEndedByDEL(t *testing.T, ctx context.Context) {
	t.Helper()
	// Squats recorded before the rule: two leases rewritten in the store
	// as uid 1's under root's network, one of them at a key.
	legacy := map[string]*phasegatev1.AcquireResponse{}
	for _, rq := range []string{"future2/eth0", "old-1"} {
		a, err := r.root.Acquire(ctx, &phasegatev1.AcquireRequest{Owner: "legacy", RequestId: rq})
		if err != nil {
			t.Fatal(err)
		}
		legacy[rq] = a
	}
	r.d.signal(syscall.SIGTERM)
	if code := r.d.wait(time.Minute); code != 0 {
		t.Fatalf("stop: exit %d", code)
	}
	st, err := leases.Open(filepath.Join(r.h.stateDir, "slots.db"), leases.Options{})
	if err != nil {
		t.Fatal(err)
	}
	owner := "cni/" + r.rt.name
	for _, a := range legacy {
		if _, err := st.Update(ctx, int(a.GetSlot().GetIndex()), func(rec *leases.Record) error {
			rec.Owner, rec.Principal = owner, "uid:1"
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	st.Close()
	r.start(t)
	out, code := r.pub.as(t, "daemon", "nogroup", "slots", "list", r.S)
	if code != 0 || !strings.Contains(out, `"future2/eth0"`) || !strings.Contains(out, `"old-1"`) {
		t.Errorf("slots list as uid 1 after the restart: exit %d, want both of its old leases:\n%s", code, out)
	}
	old := legacy["old-1"]
	I := fmt.Sprint(old.GetSlot().GetIndex())
	for _, verb := range []string{"keepalive", "release"} {
		if out, code := r.pub.as(t, "daemon", "nogroup", "slots", verb, I, old.GetLeaseId(), r.S); code != 0 {
			t.Errorf("%s of its old lease by uid 1: exit %d %s", verb, code, out)
		}
	}
	future2 := containerNetns(t, "future2")
	perr := r.pub.plugin(t, "root", "", "ADD", r.rt.conf, cniKey("future2", future2)...)
	if perr == nil || perr.Code != 100 || !strings.Contains(perr.Msg, "a lease of the Slots API of uid:1") || !strings.Contains(perr.Msg, "a DEL of the key") {
		t.Fatalf("root's ADD of a key an old lease of uid 1 holds: %+v, want code 100 naming uid:1 and the DEL", perr)
	}
	if perr := r.pub.plugin(t, "root", "", "DEL", r.rt.conf, cniKey("future2", future2)...); perr != nil {
		t.Fatalf("root's DEL of the squatted key: %+v", perr)
	}
	sq := legacy["future2/eth0"]
	out, code = r.pub.as(t, "daemon", "nogroup", "slots", "release", fmt.Sprint(sq.GetSlot().GetIndex()), sq.GetLeaseId(), r.S)
	wantRefused(t, "uid 1's release of its squat after root's DEL", out, code, "FailedPrecondition")
	if perr := r.pub.plugin(t, "root", "", "ADD", r.rt.conf, cniKey("future2", future2)...); perr != nil {
		t.Fatalf("root's ADD after its DEL of the squat: %+v", perr)
	}
	if perr := r.pub.plugin(t, "root", "", "DEL", r.rt.conf, cniKey("future2", future2)...); perr != nil {
		t.Fatal(perr)
	}
	if !strings.Contains(r.d.Output(), `a lease of the Slots API held a CNI key: DEL ends it`) {
		t.Error("no log line of the squat DEL ended")
	}
}

// nobodyLeavesRootsAttachment attaches root's container on nobody's
// network, with a workload, and checks that nobody's DEL of it is refused
// and nobody's GC ends only nobody's own attachment: root's record, slot,
// container namespace and route are as they were, its workload answering
// throughout, and the refusals are audited.
func (r *cniKeysRig) nobodyLeavesRootsAttachment(t *testing.T) {
	t.Helper()
	// Root's attachment on nobody's network, and nobody's own.
	victim := containerNetns(t, "victim")
	vres := parseResult(t, r.nb.mustTool("add", victim), victim)
	vlease := attachmentIn(t, r.root, r.nb.name, victim)
	vwork := startWorkload(t, vlease.GetIndex(), victim, vres.insideAddr())
	waitFor(t, 10*time.Second, "the victim to answer", func() bool { return vwork.ok.Load() > 0 })
	before, vInode, vRoute := observeVictim(t, r.root, vlease.GetIndex()), nsInode(t, victim), defaultRoute(t, victim)
	if !strings.HasPrefix(vRoute, "default via") {
		t.Fatalf("the victim's default route: %q", vRoute)
	}
	mine := netnsOfUser(t, 65534)
	if perr := r.pub.plugin(t, "nobody", "", "ADD", r.nb.conf, cniKey("mine", mine)...); perr != nil {
		t.Fatalf("nobody's ADD on its own network into its own namespace: %+v", perr)
	}
	vkey := cniKey(cnitoolContainerID(victim), victim)
	perr := r.pub.plugin(t, "nobody", "", "DEL", r.nb.conf, vkey...)
	if perr == nil || perr.Code != 100 || !strings.Contains(perr.Msg, "uid:0's attachment: only uid:0 or root may end it") {
		t.Errorf("nobody's DEL of root's attachment on nobody's network: %+v, want code 100 naming uid:0", perr)
	}
	valid := []map[string]string{{"containerID": "gone", "ifname": "eth0"}} // a valid list, without root's
	if perr := r.pub.plugin(t, "nobody", "", "GC", r.nb.confWith(map[string]any{"cni.dev/valid-attachments": valid})); perr != nil {
		t.Fatalf("nobody's GC of its network: %+v", perr)
	}
	left := cniLeases(t, r.d, r.nb.name)
	if len(left) != 1 || left[0].GetAttachedNetnsPath() != victim {
		t.Errorf("nobody's network after nobody's GC: %v, want root's attachment alone", left)
	}
	before.same(t, observeVictim(t, r.root, vlease.GetIndex()), "nobody's DEL and GC")
	if nsInode(t, victim) != vInode {
		t.Error("the victim container's namespace was replaced")
	}
	if got := defaultRoute(t, victim); got != vRoute {
		t.Errorf("the victim's default route after nobody's DEL and GC: %q, was %q", got, vRoute)
	}
	r.nb.mustTool("check", victim)
	if ok, failed, last := vwork.finish(); ok == 0 || failed != 0 {
		t.Errorf("the victim's workload: %d answered, %d failed (last: %v)", ok, failed, last)
	}
	logs := r.d.Output()
	for _, want := range []string{
		`method=CNIGC surface=socket principal=uid:65534`,
		`released=1 kept=1 kept_by=uid:0`,
		`msg="control call refused" audit=true method=CNIDel surface=socket principal=uid:65534`,
	} {
		if !strings.Contains(logs, want) {
			t.Errorf("no audit line with %s", want)
		}
	}
}
