package slotsapi

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
	"github.com/phasegate/phasegate/phases/internal/leasetest"
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
	policy := leasetest.PolicyOf(t, 0, "uid:65534=*")
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
			if st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), la.codePoint) || !leasetest.Printable(st.Message()) {
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
	if err == nil && got.GetSlot().GetUsage() == nil {
		t.Errorf("Get of the victim's slot has no usage")
	} else if err == nil {
		got.Slot.Usage = nil // Acquire answers none: nothing was counted yet
	}
	if err != nil || !proto.Equal(got.GetSlot(), victim.GetSlot()) {
		t.Errorf("Get of the victim's slot: %v %v, want %v", got, err, victim.GetSlot())
	}
}
