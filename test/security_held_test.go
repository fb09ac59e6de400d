package test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/phasegate/phasegate/phases"
)

// The held slots are root's alone: nobody, granted leases of its own
// owners on the control socket, and a member of the socket's group granted
// nothing, try to list, adopt and release a held slot a victim's workload
// lives in. Every call is refused (nobody's audited; the member's
// connection closed at accept), and the victim's slot is as
// it was: held with the same record, its namespace and process, its
// workload answering throughout.
func TestHeldSlotsAreRootsAlone(t *testing.T) {
	pub := newPublicDir(t)
	h := newHost(t)
	sock := filepath.Join(pub.dir, "control.sock")
	args := h.args(freePort(t), "--slots=64", "--control-socket="+sock, "--control-group=nogroup",
		"--allow=uid:65534=tenant-b-*")
	d := start(t, nil, args...)
	d.waitServing(time.Minute)
	victim := leaseWorkloads(t, d.slots(), 1)[0]
	d.signal(syscall.SIGKILL)
	d.wait(30 * time.Second)
	if err := os.Remove(filepath.Join(h.stateDir, phases.StateFileName)); err != nil {
		t.Fatal(err)
	}
	d = start(t, nil, args...)
	d.waitReclaimed(time.Minute)
	before := heldList(t, d)
	if len(before.Held) != 1 || before.Held[0].Index != int(victim.slot.GetIndex()) {
		t.Fatalf("held %+v, want the victim's slot %d", before.Held, victim.slot.GetIndex())
	}
	idx := strconv.Itoa(int(victim.slot.GetIndex()))
	S := "--socket=" + sock
	for _, user := range []struct{ name, group string }{{"nobody", ""}, {"daemon", "nogroup"}} {
		for _, call := range [][]string{
			{"list"},
			{"adopt", idx, "--owner=tenant-b-1", "--request-id=steal"},
			{"release", idx},
		} {
			out, code := pub.as(t, user.name, user.group, append(append([]string{"held"}, call...), S)...)
			if user.name == "daemon" {
				// A member the policy grants nothing is closed at accept,
				// before its request is read.
				// The client sees its connection end however the close
				// meets its write (EOF, a reset, a broken pipe): no answer.
				if code != 1 || !strings.Contains(out, "control socket") || strings.Contains(out, "Denied") || strings.Contains(out, `"held"`) {
					t.Errorf("held %s as daemon: exit %d %q, want exit 1, the connection closed at accept", call[0], code, strings.TrimSpace(out))
				}
				continue
			}
			wantRefused(t, "held "+call[0]+" as "+user.name, out, code, "PermissionDenied")
		}
	}
	if !strings.Contains(d.Output(), `msg="connection refused: its peer is not admitted here" surface=socket peer=uid:1 `) {
		t.Error("no log line of the member's connections refused at accept")
	}
	after := heldList(t, d)
	if len(after.Held) != 1 || !sameHeld(after.Held[0], before.Held[0]) {
		t.Errorf("the held slot after the attacks: %+v, before %+v", after.Held, before.Held)
	}
	victim.survives(t, "after the attacks")
	for _, method := range []string{"HeldAdopt", "HeldRelease"} {
		if !strings.Contains(d.Output(), `msg="control call refused" audit=true method=`+method+` surface=socket principal=uid:65534`) {
			t.Errorf("no audit line of nobody's refused %s", method)
		}
	}
	ok, failed, last := victim.w.finish()
	if failed != 0 || ok == 0 {
		t.Errorf("the victim's workload: %d probes failed (last %v), %d answered", failed, last, ok)
	}
	d.signal(syscall.SIGTERM)
	if code := d.wait(time.Minute); code != 0 {
		t.Fatalf("stop: exit %d", code)
	}
	h.decommission(h.prefix)
}

// sameHeld compares what the daemon says of a held slot, the processes in
// it aside.
func sameHeld(a, b phases.HeldView) bool {
	return a.Index == b.Index && a.Netns == b.Netns && a.Reason == b.Reason && a.Since.Equal(b.Since) &&
		a.Owner == b.Owner && a.NetnsBound == b.NetnsBound && a.HostLink == b.HostLink
}
