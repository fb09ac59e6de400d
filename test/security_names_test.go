package test

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
	"github.com/phasegate/phasegate/network/leases"
)

// lookAlikeOwners are owners built to look like "rt-victim", each with
// the code point its refusal must name. (NUL cannot be in an argument; the
// phases tests send it.)
var lookAlikeOwners = []struct{ name, codePoint string }{
	{"rt-victim\u3164", "U+3164"},                          // HANGUL FILLER, invisible
	{"rt-victim\u2800", "U+2800"},                          // BRAILLE PATTERN BLANK
	{"rt-vict\u0430m", "U+0430"},                           // a Cyrillic a
	{"rt-victim" + strings.Repeat("\u0301", 40), "U+0301"}, // 40 combining marks
	{"rt-\u200bvictim", "U+200B"},                          // ZERO WIDTH SPACE
	{"rt\u00ad-victim", "U+00AD"},                          // SOFT HYPHEN
	{"rt-\uff56ictim", "U+FF56"},                           // a fullwidth v
	{"rt-victim-cafe\u0301", "U+0301"},                     // NFD of "rt-victim-café"
	{"rt-\u202emitciv", "U+202E"},                          // RIGHT-TO-LEFT OVERRIDE
	{"rt-victim\x1b[2K", "U+001B"},                         // ESC
	{"rt-victim ", "U+0020"},                               // a trailing space
}

// asciiOnly reports whether s has no byte outside ASCII.
func asciiOnly(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

// A tenant the policy lets lease every owner starting "rt-" (nobody, over
// the control socket, with no credentials but its uid) cannot lease a name
// that looks like the victim's "rt-victim", as owner or as request id: each
// is refused, the refusal names the code point and holds no byte outside
// ASCII, and neither `slots list` nor the log ever shows the look-alike.
// The victim — root's lease with a workload in its slot — is untouched:
// same record, namespace inode and host link, its workload answering.
//
// Then a lease recorded before the rule under a name it refuses (nobody's
// lease, its owner rewritten in the store as a build before this one wrote
// it: the record's encoding did not change) survives a restart and keeps
// working for its principal: listed, escaped, by `slots list`; renewed;
// released, with the audit line showing the name escaped. The same name
// is refused to a new Acquire.
func TestLookAlikeOwnersRefused(t *testing.T) {
	pub := newPublicDir(t)
	h := newHost(t)
	addr := freePort(t)
	sock := filepath.Join(pub.dir, "control.sock")
	r := &lookAlikeRig{pub: pub, h: h, S: "--socket=" + sock,
		args: h.args(addr, "--slots=64", "--control-socket="+sock, "--control-group=nogroup", "--allow=uid:65534=rt-*")}
	r.start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	victim, err := r.root.Acquire(ctx, &phasegatev1.AcquireRequest{Owner: "rt-victim", RequestId: "sandbox-abc"})
	if err != nil {
		t.Fatal(err)
	}
	vi := victim.GetSlot().GetIndex()
	inside, _, _ := strings.Cut(victim.GetSlot().GetInsideAddress(), "/")
	work := startWorkload(t, vi, victim.GetSlot().GetNetnsPath(), inside)
	waitFor(t, 10*time.Second, "the victim's workload to answer", func() bool { return work.ok.Load() > 0 })
	before := observeVictim(t, r.root, vi)

	r.lookAlikesRefused(t)
	out, code := r.pub.as(t, "root", "", "slots", "list", r.S)
	if code != 0 || !asciiOnly(out) || strings.Count(out, `"owner"`) != 1 || !strings.Contains(oneSpace(out), `"owner": "rt-victim"`) {
		t.Errorf("slots list as root after the look-alikes: exit %d, want the victim's lease alone, in ASCII:\n%s", code, out)
	}
	before.same(t, observeVictim(t, r.root, vi), "the look-alike owners")
	logs := r.d.Output()
	checkNoLookAlikeLogged(t, logs)
	if ok, failed, last := work.finish(); ok == 0 || failed != 0 {
		t.Errorf("the victim's workload: %d answered, %d failed (last: %v)", ok, failed, last)
	}
	if !strings.Contains(logs, `msg="control call refused" audit=true method=Acquire surface=socket principal=uid:65534`) ||
		!strings.Contains(logs, `outcome=InvalidArgument reason="owner \"rt-victim\\u3164\": U+3164, outside ASCII (Lo, Hangul), at byte 9: names are`) {
		t.Error("no audit line of nobody's refused Acquire of rt-victim+U+3164 naming the code point, the name escaped")
	}

	r.oldNameKeepsWorking(t, ctx)
	if got, err := r.root.Get(ctx, &phasegatev1.GetRequest{Index: vi}); err != nil || got.GetSlot().GetOwner() != "rt-victim" || got.GetSlot().GetNetnsPath() != before.slot.GetNetnsPath() {
		t.Errorf("the victim's lease after the restart: %v %v", got, err)
	}
	r.d.signal(syscall.SIGTERM)
	if code := r.d.wait(time.Minute); code != 0 {
		t.Fatalf("stop: exit %d", code)
	}
	logs = r.d.Output()
	if strings.Contains(logs, oldLookAlikeName) {
		t.Error("the daemon's log shows the old lease's owner raw")
	}
	if !strings.Contains(logs, `method=Release surface=socket principal=uid:65534`) || !strings.Contains(logs, `owner=rt-victim\u3164`) {
		t.Error("no audit line of the old lease's Release naming its owner escaped")
	}
	r.h.decommission(r.h.prefix)
}

// oldLookAlikeName is the name a build before the rule recorded, which
// the rule refuses: rt-victim and U+3164.
const oldLookAlikeName = "rt-victim\u3164"

// lookAlikeRig is TestLookAlikeOwnersRefused's daemon (started with
// args, restarted once) and its control socket's flag S.
type lookAlikeRig struct {
	pub  *publicDir
	h    *host
	args []string
	S    string
	d    *daemon
	root phasegatev1.SlotsClient
}

// start starts the daemon with the rig's args and waits until it serves.
func (r *lookAlikeRig) start(t *testing.T) {
	t.Helper()
	r.d = start(t, nil, r.args...)
	r.d.waitServing(time.Minute)
	r.root = r.d.slots()
}

// lookAlikesRefused has nobody acquire each look-alike of rt-victim, as
// owner and as request id: each refused, the refusal naming the rule and
// the code point, in ASCII.
func (r *lookAlikeRig) lookAlikesRefused(t *testing.T) {
	t.Helper()
	for _, la := range lookAlikeOwners {
		for _, call := range [][]string{
			{"acquire", la.name, "--request-id=sandbox-abc"},
			{"acquire", la.name},
			{"acquire", "rt-tenant", "--request-id=sandbox-abc" + strings.TrimPrefix(la.name, "rt-victim")},
		} {
			out, code := r.pub.as(t, "nobody", "", append(append([]string{"slots"}, call...), r.S)...)
			wantRefused(t, fmt.Sprintf("as nobody: %q", call), out, code, "InvalidArgument")
			if !strings.Contains(out, la.codePoint) || !asciiOnly(out) || !strings.Contains(out, "names are printable ASCII") {
				t.Errorf("as nobody: %q: %q, want the rule and %s named, in ASCII", call, out, la.codePoint)
			}
		}
	}
}

// checkNoLookAlikeLogged checks no look-alike's code point is in the
// daemon's log raw (a space is everywhere, and shown as \x20 in the
// refusal).
func checkNoLookAlikeLogged(t *testing.T, logs string) {
	t.Helper()
	for _, la := range lookAlikeOwners {
		// The code point itself, anywhere in the log (a space is
		// everywhere, and shown as \x20 in the refusal).
		n, _ := strconv.ParseUint(la.codePoint[2:], 16, 32)
		if r := rune(n); r != ' ' && strings.ContainsRune(logs, r) {
			t.Errorf("the daemon's log holds %s raw", la.codePoint)
		}
	}
}

// oldNameKeepsWorking records a lease of nobody's under a name the rule
// refuses (its owner rewritten in the store as a build before the rule
// wrote it), restarts the daemon, and checks the lease is listed escaped,
// renewed and released by its principal while the name is refused to a
// new Acquire.
func (r *lookAlikeRig) oldNameKeepsWorking(t *testing.T, ctx context.Context) {
	t.Helper()
	out, code := r.pub.as(t, "nobody", "", "slots", "acquire", "rt-old", "--request-id=job-1", r.S)
	var old struct {
		Slot struct {
			Index uint32 `json:"index"`
		} `json:"slot"`
		LeaseID string `json:"lease_id"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &old) != nil {
		t.Fatalf("acquire rt-old as nobody: exit %d %s", code, out)
	}
	r.d.signal(syscall.SIGTERM)
	if code := r.d.wait(time.Minute); code != 0 {
		t.Fatalf("stop: exit %d", code)
	}
	st, err := leases.Open(filepath.Join(r.h.stateDir, "slots.db"), leases.Options{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = st.Update(ctx, int(old.Slot.Index), func(rec *leases.Record) error { rec.Owner = oldLookAlikeName; return nil })
	st.Close()
	if err != nil {
		t.Fatal(err)
	}
	r.start(t)
	I := fmt.Sprint(old.Slot.Index)
	for _, user := range []string{"nobody", "root"} {
		out, code := r.pub.as(t, user, "", "slots", "list", r.S)
		if code != 0 || !asciiOnly(out) || !strings.Contains(oneSpace(out), `"owner": "rt-victim\u3164"`) {
			t.Errorf("slots list as %s: exit %d, want the old lease's owner escaped, in ASCII:\n%s", user, code, out)
		}
	}
	if out, code := r.pub.as(t, "nobody", "", "slots", "keepalive", I, old.LeaseID, r.S); code != 0 {
		t.Errorf("keepalive of the old lease by its principal: exit %d %s", code, out)
	}
	out, code = r.pub.as(t, "nobody", "", "slots", "acquire", oldLookAlikeName, "--request-id=job-1", r.S)
	wantRefused(t, "acquire of the old lease's name as nobody", out, code, "InvalidArgument")
	if out, code := r.pub.as(t, "nobody", "", "slots", "release", I, old.LeaseID, r.S); code != 0 {
		t.Errorf("release of the old lease by its principal: exit %d %s", code, out)
	}
	if got, err := r.root.Get(ctx, &phasegatev1.GetRequest{Index: old.Slot.Index}); err != nil || got.GetSlot().GetOwner() != "" {
		t.Errorf("the old lease's slot after its release: %v %v", got, err)
	}
}

// oneSpace is s with every run of white space one space: protojson's
// multiline output puts one or two spaces after a colon, as its build
// decides, so that no one relies on its bytes.
func oneSpace(s string) string { return strings.Join(strings.Fields(s), " ") }
