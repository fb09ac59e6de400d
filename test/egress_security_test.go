package test

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
	"github.com/phasegate/phasegate/network/leases"
)

// An unprivileged user cannot change another tenant's egress policy, with
// or without its lease id, nor can a principal that may only read the
// victim's leases; hostile policies on its own lease are refused; the
// victim's record, namespace and very rules are untouched; every refusal
// is audited. The attacker's own lease takes a policy (the positive
// control).
func TestEgressPolicyAttacks(t *testing.T) {
	pub := newPublicDir(t)
	h := newHost(t)
	sock := filepath.Join(pub.dir, "control.sock")
	args := h.args(freePort(t), "--slots=16", "--control-socket="+sock, "--control-group=nogroup",
		"--allow=uid:65534=tenant-b-*", "--allow-read=uid:1=victim")
	d := start(t, nil, args...)
	d.waitServing(time.Minute)
	root := d.slots()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	victim, err := root.Acquire(ctx, &phasegatev1.AcquireRequest{Owner: "victim", RequestId: "vm-abc",
		EgressPolicy: &phasegatev1.EgressPolicy{Allow: []string{"192.0.2.0/24"}, DenyAll: false}})
	if err != nil {
		t.Fatal(err)
	}
	vi := victim.GetSlot().GetIndex()
	idx := fmt.Sprint(vi)
	before := observeVictim(t, root, vi)
	rules := insideRules(t, before.slot.GetNetnsPath())
	S := "--socket=" + sock

	for _, tc := range []struct {
		what, user, group string
		args              []string
	}{
		{"deny-all with the victim's lease id", "nobody", "", []string{"egress", idx, victim.GetLeaseId(), "--egress-deny-all"}},
		{"allow everything with the victim's lease id", "nobody", "", []string{"egress", idx, victim.GetLeaseId(), "--egress-allow=0.0.0.0/1,128.0.0.0/1"}},
		{"clear with the victim's lease id", "nobody", "", []string{"egress", idx, victim.GetLeaseId()}},
		{"a guessed lease id", "nobody", "", []string{"egress", idx, leases.NewLeaseID(), "--egress-deny-all"}},
		{"a hostile policy with the victim's lease id", "nobody", "", []string{"egress", idx, victim.GetLeaseId(), "--egress-allow=0.0.0.0/0"}},
		{"a read-only principal of the owner", "daemon", "nogroup", []string{"egress", idx, victim.GetLeaseId(), "--egress-deny-all"}},
	} {
		out, code := pub.as(t, tc.user, tc.group, append(append([]string{"slots"}, tc.args...), S)...)
		wantRefused(t, "as "+tc.user+": "+tc.what, out, code, "PermissionDenied")
	}
	after := observeVictim(t, root, vi)
	before.same(t, after, "the egress attacks")
	if got := insideRules(t, before.slot.GetNetnsPath()); got != rules {
		t.Errorf("the victim's rules changed:\nbefore:\n%s\nafter:\n%s", rules, got)
	}

	ownLeaseRefusesHostilePolicies(t, pub, S)
	before.same(t, observeVictim(t, root, vi), "the attacker's own calls")

	d.signal(syscall.SIGTERM)
	if code := d.wait(time.Minute); code != 0 {
		t.Fatalf("stop: exit %d", code)
	}
	for _, p := range []string{"uid:65534", "uid:1"} {
		if !strings.Contains(d.Output(), `msg="control call refused" audit=true method=SetEgressPolicy surface=socket principal=`+p) {
			t.Errorf("no audit line of %s's refused SetEgressPolicy:\n%s", p, grepLines(d.Output(), "SetEgressPolicy"))
		}
	}
	st, err := leases.Open(filepath.Join(h.stateDir, "slots.db"), leases.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rec, ok, err := st.Get(int(vi))
	st.Close()
	if err != nil || !ok || rec.Egress == nil || len(rec.Egress.Allow) != 1 || rec.Egress.Allow[0].String() != "192.0.2.0/24" || rec.Egress.DenyAll {
		t.Fatalf("the victim's record after the attacks: %+v %v %v", rec, ok, err)
	}
	h.decommission(h.prefix)
}

// ownLeaseRefusesHostilePolicies has nobody acquire a lease of its own
// (the positive control) and checks hostile policies on it are refused
// with InvalidArgument and a sane one is taken.
func ownLeaseRefusesHostilePolicies(t *testing.T, pub *publicDir, S string) {
	t.Helper()
	out, code := pub.as(t, "nobody", "", "slots", "acquire", "tenant-b-1", "--egress-deny=10.0.0.0/8", S)
	if code != 0 {
		t.Fatalf("nobody's own acquire: exit %d\n%s", code, out)
	}
	var own struct {
		Slot struct {
			Index int `json:"index"`
		} `json:"slot"`
		LeaseID string `json:"lease_id"`
	}
	if err := json.Unmarshal([]byte(out), &own); err != nil || own.LeaseID == "" {
		t.Fatalf("nobody's own acquire: %v\n%s", err, out)
	}
	ownIdx := fmt.Sprint(own.Slot.Index)
	for _, hostile := range []string{"--egress-allow=::/0", "--egress-deny=1.2.3.4/8", "--egress-allow=10.0.0.0/8,10.1.0.0/16", "--egress-redirect-tcp"} {
		out, code := pub.as(t, "nobody", "", "slots", "egress", ownIdx, own.LeaseID, hostile, S)
		wantRefused(t, "own lease, "+hostile, out, code, "InvalidArgument")
	}
	out, code = pub.as(t, "nobody", "", "slots", "egress", ownIdx, own.LeaseID, "--egress-deny-all", S)
	var set struct {
		Slot struct {
			Egress struct {
				DenyAll bool `json:"deny_all"`
			} `json:"egress_policy"`
		} `json:"slot"`
	}
	if err := json.Unmarshal([]byte(out), &set); code != 0 || err != nil || !set.Slot.Egress.DenyAll {
		t.Errorf("nobody's change of its own policy: exit %d %v\n%s", code, err, out)
	}
}
