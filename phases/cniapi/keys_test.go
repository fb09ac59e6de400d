package cniapi

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	cniv1 "github.com/phasegate/phasegate/api/cni/v1"
	"github.com/phasegate/phasegate/control"
	"github.com/phasegate/phasegate/network/leases"
	"github.com/phasegate/phasegate/network/netns"
	"github.com/phasegate/phasegate/phases/internal/leasetest"
	"github.com/phasegate/phasegate/phases/lease"
)

// cniRig is a CNI service over a slots rig, with containers' namespaces.
type cniRig struct {
	svc   *lease.Service
	store *leases.Store
	c     *Service
}

func newCNIRig(t *testing.T) *cniRig {
	_, mgr, store := leasetest.NewSlotHost(t, 8)
	pl := leasetest.NewPool(t, mgr, store, 8, 2)
	log := slog.New(slog.DiscardHandler)
	svc := lease.New(mgr, pl, lease.Options{Records: lease.NewRecords(store, log), Log: log})
	return &cniRig{svc: svc, store: store, c: &Service{slots: svc, degraded: func() string { return "" }}}
}

// container makes a network namespace standing for a container's, as a
// runtime would, removed at the end.
func container(t *testing.T, name string) string {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	path, err := netns.Create(ctx, dir, name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := netns.Delete(ctx, dir, name); err != nil {
			t.Errorf("remove the container's namespace: %v", err)
		}
		for unix.Unmount(dir, unix.MNT_DETACH) == nil {
		}
	})
	return path
}

// attachAs attaches key k to the namespace at path as caller c, by the
// service's acquire, as an ADD that passed its checks does: how a lease
// taken before this build, or another principal's, is made here.
func (r *cniRig) attachAs(t *testing.T, c control.Caller, k cniv1.Key, path string) lease.Lease {
	t.Helper()
	to, err := openTarget(path, k.IfName)
	if err != nil {
		t.Fatal(err)
	}
	defer to.close()
	a, err := r.svc.Attach(context.Background(), c, lease.Request{Owner: k.Owner(), RequestID: k.RequestID(), Attach: to})
	if err != nil {
		t.Fatal(err)
	}
	return a.Lease
}

func cniCode(err error) uint {
	var ce *cniError
	if errors.As(err, &ce) {
		return ce.e.Code
	}
	return 0
}

// A CNI key belongs to the network's attach: a lease of the Slots API
// taken under it before this build (mallet's, "future/eth0") makes root's
// ADD fail naming mallet and saying what ends it; root's DEL ends it (and
// mallet's lease is gone); root's ADD then attaches. Another principal
// granted attach for the network (alice) neither ends root's attachment
// by DEL (refused naming uid:0) nor by GC with a list that leaves it out:
// GC ends alice's own and answers root's as kept, with why. Root's GC
// ends every attachment of the network.
func TestCNIKeysAndGCPerPrincipal(t *testing.T) {
	r := newCNIRig(t)
	ctx := context.Background()
	policy := leasetest.PolicyOf(t, 0, "uid:65534=cni/*")
	rule, err := control.ParseRule("uid:1001=cni/pgnet", false)
	if err != nil {
		t.Fatal(err)
	}
	rule.Attach = true
	policy.Rules = append(policy.Rules, rule)
	future := cniv1.Key{Network: "pgnet", ContainerID: "future", IfName: "eth0"}
	squat, err := r.svc.Attach(ctx, leasetest.CallerOf(mallet, policy), lease.Request{Owner: future.Owner(), RequestID: future.RequestID()})
	if err != nil {
		t.Fatal(err)
	}
	squatted := squat.Lease.Rec

	ctrFuture := container(t, "future")
	add := cniv1.AddRequest{Key: future, Netns: ctrFuture}
	_, err = r.c.add(as(ctx, root, policy), add)
	if cniCode(err) != cniv1.CodeRefused || !strings.Contains(err.Error(), "a lease of the Slots API of uid:65534") || !strings.Contains(err.Error(), "a DEL of the key") {
		t.Fatalf("root's ADD of the squatted key: %v, want code 100 naming uid:65534 and the DEL that ends it", err)
	}
	if err := r.c.del(as(ctx, root, policy), cniv1.DelRequest{Key: future}); err != nil {
		t.Fatalf("root's DEL of the squatted key: %v", err)
	}
	err = r.svc.Release(ctx, leasetest.CallerOf(mallet, policy), squatted.Index, squatted.LeaseID)
	if !errors.Is(err, lease.ErrPrecondition) {
		t.Errorf("mallet's Release of its squat after root's DEL: %v, want FailedPrecondition (not leased)", err)
	}
	if _, err := r.c.add(as(ctx, root, policy), add); err != nil {
		t.Fatalf("root's ADD after its DEL: %v", err)
	}

	// Alice shares the network: her own attachment, and root's.
	mine := cniv1.Key{Network: "pgnet", ContainerID: "mine", IfName: "eth0"}
	r.attachAs(t, leasetest.CallerOf(alice, policy), mine, container(t, "mine"))
	rootsKey := cniv1.Key{Network: "pgnet", ContainerID: "roots", IfName: "eth0"}
	roots := (r.attachAs(t, leasetest.CallerOf(root, nil), rootsKey, container(t, "roots"))).Rec

	err = r.c.del(as(ctx, alice, policy), cniv1.DelRequest{Key: rootsKey})
	if cniCode(err) != cniv1.CodeRefused || !strings.Contains(err.Error(), "uid:0's attachment: only uid:0 or root may end it") {
		t.Fatalf("alice's DEL of root's attachment: %v, want code 100 naming uid:0", err)
	}
	// Her ADD of root's key names a namespace she could not enter (root
	// made it): refused for that first, before anything says whose the
	// key is (test/cni_keys_test.go ADDs from a namespace of her own).
	_, err = r.c.add(as(ctx, alice, policy), cniv1.AddRequest{Key: rootsKey, Netns: container(t, "alices")})
	if cniCode(err) != cniv1.CodeRefused || !strings.Contains(err.Error(), "may enter") || strings.Contains(err.Error(), "uid:0's attachment") {
		t.Fatalf("alice's ADD of root's key into root's namespace: %v, want code 100 for the namespace alone", err)
	}
	got, err := r.c.gc(as(ctx, alice, policy), cniv1.GCRequest{Network: "pgnet"})
	if err != nil {
		t.Fatal(err)
	}
	if got.Released != 1 || len(got.Kept) != 2 {
		t.Fatalf("alice's GC, nothing valid: %+v, want her attachment released, root's two kept", got)
	}
	for _, k := range got.Kept {
		if k.Principal != "uid:0" || k.IfName != "eth0" || (k.ContainerID != "future" && k.ContainerID != "roots") || !strings.Contains(k.Reason, "only uid:0 or root") {
			t.Errorf("kept %+v, want root's, with why", k)
		}
	}
	if l, ok := r.svc.ByRequest(mine.Owner(), mine.RequestID()); ok {
		t.Errorf("alice's own attachment outlived her GC: %+v", l.Rec)
	}
	if after := r.svc.At(roots.Index); after == nil || after.Rec.LeaseID != roots.LeaseID {
		t.Fatalf("root's attachment after alice's GC and DEL: %v", after)
	}
	got, err = r.c.gc(as(ctx, root, policy), cniv1.GCRequest{Network: "pgnet", Valid: []cniv1.ValidKey{{ContainerID: "future", IfName: "eth0"}}})
	if err != nil || got.Released != 1 || len(got.Kept) != 0 {
		t.Fatalf("root's GC keeping future: %+v %v, want roots released, nothing kept", got, err)
	}
	if err := r.c.del(as(ctx, root, policy), cniv1.DelRequest{Key: future}); err != nil {
		t.Fatal(err)
	}
}

// Who ends what holds a key: the attachment's principal and root; any
// principal granted attach for the network, a lease of the Slots API
// squatting it. Another's ADD of the key is refused naming the holder.
func TestKeyHolders(t *testing.T) {
	policy := leasetest.PolicyOf(t, 0)
	for _, uid := range []string{"1001", "1002"} {
		rule, err := control.ParseRule("uid:"+uid+"=cni/pgnet", false)
		if err != nil {
			t.Fatal(err)
		}
		rule.Attach = true
		policy.Rules = append(policy.Rules, rule)
	}
	bob := control.Principal{Kind: control.Unix, UID: 1002, GID: 1002}
	k := cniv1.Key{Network: "pgnet", ContainerID: "c1", IfName: "eth0"}
	attachment := func(p control.Principal) lease.Lease {
		l := lease.Lease{}
		l.Rec.Owner, l.Rec.RequestID, l.Rec.Principal, l.Rec.Index = k.Owner(), k.RequestID(), p.String(), 3
		l.Rec.Attachment = &leases.Attachment{NetnsPath: "/run/netns/c1", IfName: "eth0"}
		return l
	}
	squat := attachment(mallet)
	squat.Rec.Attachment = nil
	for _, tc := range []struct {
		what    string
		c       control.Principal
		l       lease.Lease
		mayEnd  bool
		addRefd string // "" for an ADD let through to acquire
	}{
		{"its principal", alice, attachment(alice), true, ""},
		{"root, another's", root, attachment(alice), true, "uid:1001's attachment to /run/netns/c1"},
		{"another granted attach", bob, attachment(alice), false, "uid:1001's attachment to /run/netns/c1: only uid:1001 or root"},
		{"root's, by another granted attach", alice, attachment(root), false, "uid:0's attachment"},
		{"a squat, by one granted attach", alice, squat, true, "a lease of the Slots API of uid:65534"},
		{"a squat, by root", root, squat, true, "a lease of the Slots API of uid:65534"},
	} {
		c := leasetest.CallerOf(tc.c, policy)
		if got := whyKept(c, tc.l.Rec) == ""; got != tc.mayEnd {
			t.Errorf("%s: may end %v, want %v (%q)", tc.what, got, tc.mayEnd, whyKept(c, tc.l.Rec))
		}
		err := keyTaken(c, k, tc.l)
		switch {
		case tc.addRefd == "" && err != nil:
			t.Errorf("%s: ADD refused: %v", tc.what, err)
		case tc.addRefd != "" && (cniCode(err) != cniv1.CodeRefused || !strings.Contains(err.Error(), tc.addRefd)):
			t.Errorf("%s: ADD %v, want code 100 naming %q", tc.what, err, tc.addRefd)
		}
	}
}

// The tests' principals and callers (internal/leasetest).
var (
	root   = leasetest.Root
	alice  = leasetest.Alice
	mallet = leasetest.Mallet
	as     = leasetest.As
)
