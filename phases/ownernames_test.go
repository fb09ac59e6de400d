package phases

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/utils"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	cniv1 "github.com/phasegate/phasegate/api/cni/v1"
	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
	"github.com/phasegate/phasegate/control"
	"github.com/phasegate/phasegate/internal/names"
	"github.com/phasegate/phasegate/network/leases"
	"github.com/phasegate/phasegate/network/slot"
)

// lookAlikes are names built to look like "rt-victim" (or like each
// other), each with the code point its refusal must name.
var lookAlikes = []struct{ name, codePoint string }{
	{"rt-victim\u3164", "U+3164"},                          // HANGUL FILLER, invisible
	{"rt-victim\u2800", "U+2800"},                          // BRAILLE PATTERN BLANK
	{"rt-vict\u0430m", "U+0430"},                           // CYRILLIC SMALL LETTER A
	{"rt-victim" + strings.Repeat("\u0301", 40), "U+0301"}, // 40 combining marks
	{"rt-\u200bvictim", "U+200B"},                          // ZERO WIDTH SPACE
	{"rt\u00ad-victim", "U+00AD"},                          // SOFT HYPHEN
	{"\uff52\uff54-victim", "U+FF52"},                      // fullwidth letters
	{"rt-victim-caf\u00e9", "U+00E9"},                      // NFC
	{"rt-victim-cafe\u0301", "U+0301"},                     // NFD of the same
	{"rt-\u202emitciv", "U+202E"},                          // RIGHT-TO-LEFT OVERRIDE
	{"rt-victim\x1b[2K", "U+001B"},                         // ESC
	{"rt-victim\x00", "U+0000"},                            // NUL
	{"rt-victim ", "U+0020"},                               // a trailing space
}

// A principal granted every owner cannot lease a name that looks like
// another's, as owner or as request id: each is refused with
// InvalidArgument naming the code point, in printable ASCII, before
// anything is leased; the victim's lease and record are as they were, and
// List shows one lease, of "rt-victim", exactly as its client sent it.
func TestAcquireRefusesNamesThatLookLikeAnother(t *testing.T) {
	r := newSlotsRig(t, 4, 1)
	ctx := context.Background()
	policy := policyOf(t, 0, "uid:65534=*")
	victim, err := r.svc.Acquire(as(ctx, root, policy), &phasegatev1.AcquireRequest{Owner: "rt-victim", RequestId: "sandbox-abc"})
	if err != nil {
		t.Fatal(err)
	}
	i := victim.GetSlot().GetIndex()
	if got := victim.GetSlot().GetOwner(); got != "rt-victim" {
		t.Fatalf("the answer's owner %q, want the bytes sent", got)
	}
	before, ok, err := r.store.Get(int(i))
	if err != nil || !ok || before.Owner != "rt-victim" || before.RequestID != "sandbox-abc" {
		t.Fatalf("the victim's record: %+v %v %v", before, ok, err)
	}
	attacker := as(ctx, mallet, policy)
	for _, la := range lookAlikes {
		for _, req := range []*phasegatev1.AcquireRequest{
			{Owner: la.name, RequestId: "sandbox-abc"},
			{Owner: "rt-victim", RequestId: "sandbox-abc" + strings.TrimPrefix(la.name, "rt-victim")},
			{Owner: la.name},
		} {
			_, err := r.svc.Acquire(attacker, req)
			st := status.Convert(err)
			if st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), la.codePoint) || !printable(st.Message()) {
				t.Errorf("Acquire %q / %q: %v, want InvalidArgument naming %s in printable ASCII", req.GetOwner(), req.GetRequestId(), err, la.codePoint)
			}
		}
	}
	list, err := r.svc.List(as(ctx, root, nil), &phasegatev1.ListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var owners []string
	for _, sl := range list.GetSlots() {
		if sl.GetOwner() != "" {
			owners = append(owners, sl.GetOwner())
		}
	}
	if len(owners) != 1 || owners[0] != "rt-victim" {
		t.Errorf("List after the look-alikes: leases of %q, want the victim's alone", owners)
	}
	after, ok, err := r.store.Get(int(i))
	if err != nil || !ok || after.LeaseID != before.LeaseID || after.Owner != before.Owner || after.RequestID != before.RequestID || after.Principal != before.Principal {
		t.Errorf("the victim's record after the look-alikes: %+v %v %v, was %+v", after, ok, err, before)
	}
	got, err := r.svc.Get(as(ctx, root, nil), &phasegatev1.GetRequest{Index: i})
	if err != nil || !proto.Equal(got.GetSlot(), victim.GetSlot()) {
		t.Errorf("Get of the victim's slot: %v %v, want %v", got, err, victim.GetSlot())
	}
}

// printable reports whether s is printable ASCII alone.
func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}

// Leases recorded before the rule, under names it refuses, keep working:
// restored, listed as recorded (NFC and NFD apart), renewed, read and
// released by their principal; /debug/slots prints them escaped, in ASCII;
// and the same names are refused to a new Acquire, a retry of their own
// request included (the lease is reached by its index and lease id).
func TestNamesRecordedBeforeTheRuleKeepWorking(t *testing.T) {
	old := map[int]struct{ owner, requestID string }{
		1: {"rt-victim\u3164", "sandbox-abc"},
		2: {"caf\u00e9", ""},
		3: {"cafe\u0301", ""},
		4: {"rt-vict\u0430m", "req-1"},
		5: {"\uff52\uff54-victim", "req\u200b"},
	}
	r := newRestoreRig(t, 8, len(old), func(rec *leases.Record) {
		rec.Owner, rec.RequestID = old[rec.Index].owner, old[rec.Index].requestID
		if rec.Index == 4 {
			rec.Principal = alice.String()
		}
	}, func(context.Context, *slot.Manager, []*slot.Slot) {})
	ctx := as(context.Background(), root, nil)
	r.verifyInBackground(t)
	st := r.states()
	for i, o := range old {
		if st[i].GetState() != phasegatev1.SlotState_SLOT_STATE_ACQUIRED || st[i].GetOwner() != o.owner || st[i].GetRequestId() != o.requestID {
			t.Errorf("slot %d restored: %v of %q (%q), want ACQUIRED of %q (%q)", i, st[i].GetState(), st[i].GetOwner(), st[i].GetRequestId(), o.owner, o.requestID)
		}
	}
	if _, err := r.d.slots.KeepAlive(ctx, &phasegatev1.KeepAliveRequest{Index: 1, LeaseId: r.recs[1].LeaseID}); err != nil {
		t.Errorf("KeepAlive of a lease whose owner the rule refuses: %v", err)
	}
	if got, err := r.d.slots.Get(ctx, &phasegatev1.GetRequest{Index: 3}); err != nil || got.GetSlot().GetOwner() != "cafe\u0301" {
		t.Errorf("Get of the NFD owner's lease: %v %v", got, err)
	}
	if _, err := r.d.slots.Release(as(context.Background(), alice, nil), &phasegatev1.ReleaseRequest{Index: 4, LeaseId: r.recs[4].LeaseID}); err != nil {
		t.Errorf("Release by its own principal of a lease whose owner the rule refuses: %v", err)
	}
	if _, err := r.d.slots.Release(ctx, &phasegatev1.ReleaseRequest{Index: 2, LeaseId: r.recs[2].LeaseID}); err != nil {
		t.Errorf("Release by root of the NFC owner's lease: %v", err)
	}
	if got := r.states(); got[3].GetOwner() != "cafe\u0301" || got[2].GetOwner() != "" || got[4].GetOwner() != "" {
		t.Errorf("after the NFC owner's lease was released: slot 2 %v, 3 %v, 4 %v; want 3 alone, its NFD owner untouched", got[2], got[3], got[4])
	}
	for _, req := range []*phasegatev1.AcquireRequest{
		{Owner: "rt-victim\u3164", RequestId: "new"},
		{Owner: "\uff52\uff54-victim", RequestId: "req\u200b"},
	} {
		if _, err := r.d.slots.Acquire(ctx, req); status.Code(err) != codes.InvalidArgument {
			t.Errorf("Acquire %q / %q, recorded before the rule: %v, want InvalidArgument", req.GetOwner(), req.GetRequestId(), err)
		}
	}
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodGet, "/debug/slots", nil)
	req = req.WithContext(control.WithCaller(req.Context(), control.Caller{Principal: root, Grant: (&control.AccessPolicy{}).Grant(root)}))
	r.d.slots.debugHandler().ServeHTTP(rec, req)
	body := rec.Body.String()
	if !printable(strings.ReplaceAll(body, "\n", " ")) || !strings.Contains(body, `"rt-victim\u3164"`) || !strings.Contains(body, `"cafe\u0301"`) {
		t.Errorf("/debug/slots: want ASCII naming the recorded names escaped:\n%s", body)
	}
}

// The CNI door takes exactly the spec's names (libcni's own validators,
// which the plugin runs too), and an ADD on top refuses an interface name
// outside the names rule, since it becomes part of the lease's request id;
// DEL and CHECK still take such a key, attached before the rule.
func TestCNIKeysFollowTheSpecAndTheRule(t *testing.T) {
	for _, s := range []string{
		"abc", "0123456789abcdef", "a.b_c-d", "A", "", "-a", ".a", "_a", "a/b", "a:b", "a b", "a\n", "\na",
		"a\u3164", "\u0430bc", "\uff41", "a\x00", "a\x1b", "a\u200b", "a$", "a*", "cni/x",
	} {
		wantID := utils.ValidateContainerID(s) == nil
		wantNet := utils.ValidateNetworkName(s) == nil
		if got := names.CheckCNIName("name", s) == nil; got != wantID || got != wantNet {
			t.Errorf("names.CheckCNIName(%q) takes it: %v; libcni: container id %v, network name %v", s, got, wantID, wantNet)
		}
	}
	good := cniv1.Key{Network: "pgnet", ContainerID: "abc123", IfName: "eth0"}
	for _, tc := range []struct {
		what       string
		key        cniv1.Key
		add, other bool // whether ADD and DEL/CHECK take it
		codePoint  string
	}{
		{"a spec key", good, true, true, ""},
		{"U+3164 in the interface name", cniv1.Key{Network: "pgnet", ContainerID: "abc123", IfName: "eth0\u3164"}, false, true, "U+3164"},
		{"ESC in the interface name", cniv1.Key{Network: "pgnet", ContainerID: "abc123", IfName: "eth\x1b"}, false, true, "U+001B"},
		{"U+3164 in the container id", cniv1.Key{Network: "pgnet", ContainerID: "abc123\u3164", IfName: "eth0"}, false, false, `"abc123\u3164"`},
		{"a Cyrillic a in the network", cniv1.Key{Network: "pgnet-\u0430", ContainerID: "abc123", IfName: "eth0"}, false, false, `"pgnet-\u0430"`},
	} {
		add, other := checkNewKey(tc.key), checkKey(tc.key)
		if (add == nil) != tc.add || (other == nil) != tc.other {
			t.Errorf("%s: ADD %v, DEL and CHECK %v; want taken %v and %v", tc.what, add, other, tc.add, tc.other)
		}
		if add != nil && (!strings.Contains(add.Error(), tc.codePoint) || !printable(add.Error())) {
			t.Errorf("%s: ADD refused with %q, want it to name %s in printable ASCII", tc.what, add, tc.codePoint)
		}
		if add != nil && status.Code(add) != codes.InvalidArgument {
			t.Errorf("%s: ADD refused with %v, want InvalidArgument", tc.what, status.Code(add))
		}
	}
}
