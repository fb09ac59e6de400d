package phases

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/network/index"
	"github.com/phasegate/phasegate/network/leases"
	"github.com/phasegate/phasegate/network/netns"
	"github.com/phasegate/phasegate/network/pool"
	"github.com/phasegate/phasegate/network/slot"
	"github.com/phasegate/phasegate/phases/lease"
	"github.com/phasegate/phasegate/phases/slotsapi"
)

// restoreRig is a daemon's restore over real slots: leases recorded for
// slots 1..len(made), what happened to each slot while the daemon was
// down, then classify, the pool and the Slots service as the start builds
// them, before the background verification has run.
type restoreRig struct {
	d    *Daemon
	api  *slotsapi.Server // the Slots API over d's leases
	mgr  *slot.Manager
	made []*slot.Slot
	recs map[int]leases.Record
}

// newRestoreRig records a lease of owner "owner-<i>" for slots 1..leased
// of n, changed by edit when it is not nil, as a build before this one
// wrote it; then meanwhile does what happens while the daemon is down.
func newRestoreRig(t *testing.T, n, leased int, edit func(*leases.Record), meanwhile func(ctx context.Context, mgr *slot.Manager, made []*slot.Slot)) *restoreRig {
	t.Helper()
	cfg, mgr, store := newSlotHost(t, n)
	ctx := context.Background()
	r := &restoreRig{mgr: mgr, recs: map[int]leases.Record{}}
	now := time.Now().Round(0)
	for i := 1; i <= leased; i++ {
		s, err := mgr.Create(ctx, i)
		if err != nil {
			t.Fatal(err)
		}
		r.made = append(r.made, s)
		rec := leases.Record{Index: i, State: leases.Leased, Owner: fmt.Sprint("owner-", i), LeaseID: leases.NewLeaseID(),
			Principal: root.String(), Acquired: now, Created: now, Netns: s.NetnsID, HostIfindex: s.HostIfIndex}
		if edit != nil {
			edit(&rec)
		}
		if err := store.Put(ctx, rec); err != nil {
			t.Fatal(err)
		}
		r.recs[i] = rec
	}
	meanwhile(ctx, mgr, r.made)

	r.d = &Daemon{cfg: Config{Slots: cfg}, log: slog.New(slog.DiscardHandler), obs: &observer{}, mgr: mgr, store: store}
	sr, err := mgr.Survey(ctx)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := store.Load()
	if err != nil {
		t.Fatal(err)
	}
	plan, err := classifier{cfg: r.d.cfg, mgr: mgr}.classify(ctx, recs, nil, sr.Inventory)
	if err != nil {
		t.Fatal(err)
	}
	r.d.plan = plan
	idx, err := index.New(n, nil)
	if err != nil {
		t.Fatal(err)
	}
	var inUse []*slot.Slot
	for _, l := range plan.restored {
		if err := idx.Claim(l.Rec.Index); err != nil {
			t.Fatal(err)
		}
		inUse = append(inUse, l.Slot)
	}
	pl, err := pool.New(mgr, idx, pool.Options{Target: 1, InUse: inUse})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pl.Close(context.Background()) })
	r.d.pool = pl
	// The lifecycle the verification runs in, as the daemon's: a
	// background task of populate, started by verifyInBackground.
	lc, err := lifecycle.New([]lifecycle.Phase{{Name: PhasePopulate, Run: func(_ context.Context, p *lifecycle.Progress) error {
		p.Defer(taskVerify, func(ctx context.Context, tp *lifecycle.Progress) error {
			return r.d.restore.Run(ctx, tp, r.d.plan.restored)
		})
		return nil
	}}})
	if err != nil {
		t.Fatal(err)
	}
	r.d.lc = lc
	t.Cleanup(func() { _ = lc.Drain(context.Background()) })
	table := lease.NewTable(plan.restored)
	records := lease.NewRecords(store, r.d.log)
	r.d.records, r.d.held = records, lease.NewHeldSlots(lc, plan.held)
	r.d.restore = &lease.RestoreCheck{Table: table, Pool: pl, Mgr: mgr, Found: plan.found, Log: r.d.log, Health: lc, Lost: plan.lostIndices(),
		Records: records, Held: r.d.held, Task: taskVerify}
	r.d.slots = lease.New(mgr, pl, lease.Options{Records: records, Table: table, Log: r.d.log, Restore: r.d.restore, Held: r.d.held})
	r.api = slotsapi.New(r.d.slots)
	return r
}

// wantLeased fails unless each slot of idx is in state want, leased to
// the owner its record names.
func (r *restoreRig) wantLeased(t *testing.T, when string, want phasegatev1.SlotState, idx ...int) {
	t.Helper()
	st := r.states()
	for _, i := range idx {
		if got := st[i].GetState(); got != want || st[i].GetOwner() != r.recs[i].Owner {
			t.Errorf("slot %d %s: %v of %q, want %v of %q", i, when, got, st[i].GetOwner(), want, r.recs[i].Owner)
		}
	}
}

// wantRepaired fails unless slot i's host link is up and its firewall
// element there.
func (r *restoreRig) wantRepaired(t *testing.T, i int) {
	t.Helper()
	link, err := netlink.LinkByIndex(r.made[i-1].HostIfIndex)
	if err != nil || link.Attrs().Flags&1 == 0 {
		t.Errorf("slot %d's host link after the repair: %v %v, want up", i, link, err)
	}
	names, err := r.mgr.Firewall().List(context.Background())
	if err != nil || !slices.Contains(names, r.made[i-1].HostIf) {
		t.Errorf("slot %d's firewall element after the repair: %v %v", i, names, err)
	}
}

// states returns every slot's state by index.
func (r *restoreRig) states() map[int]*phasegatev1.Slot {
	out := map[int]*phasegatev1.Slot{}
	list, err := r.api.List(as(context.Background(), root, nil), &phasegatev1.ListRequest{})
	if err != nil {
		panic(err) // root lists every slot
	}
	for _, s := range list.GetSlots() {
		out[int(s.GetIndex())] = s
	}
	return out
}

// verifyInBackground runs the verification as the daemon does, as a
// background task of the lifecycle, and waits for it to end.
func (r *restoreRig) verifyInBackground(t *testing.T) *lifecycle.Lifecycle {
	t.Helper()
	lc := r.d.lc
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := lc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	for {
		snap := lc.Snapshot()
		i := slices.IndexFunc(snap.Tasks, func(ts lifecycle.TaskSnapshot) bool { return ts.Name == taskVerify })
		if i >= 0 && snap.Tasks[i].State != lifecycle.TaskRunning {
			if snap.Tasks[i].State != lifecycle.TaskSucceeded {
				t.Fatalf("verification task: %+v", snap.Tasks[i])
			}
			if p := snap.Tasks[i].Progress; p.Done != p.Total || p.Unit != "leases" {
				t.Errorf("verification task's progress at its end: %+v", p)
			}
			return lc
		}
		select {
		case <-ctx.Done():
			t.Fatalf("verification did not end: %+v", snap.Tasks)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// The start restores every leased record without a system call: each lease
// is VERIFYING and its index is not handed out; the background check then
// restores the intact ones (host side repaired), and finds the others lost,
// tearing down what was at their index; the health warning names them and
// the verification's own warning is gone. A Release of a lease not yet
// verified verifies it itself, and KeepAlive works on the record.
func TestRestoredLeasesAreVerifiedAfterServing(t *testing.T) {
	const (
		intact   = 1
		repair   = 2 // host link down and firewall element gone
		madeNew  = 3 // another namespace at its path
		gone     = 4 // nothing left
		keptLive = 5 // intact, kept alive before it is verified
	)
	r := newRestoreRig(t, 8, 5, nil, func(ctx context.Context, mgr *slot.Manager, made []*slot.Slot) {
		if err := netlink.LinkSetDown(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: made[repair-1].HostIfIndex}}); err != nil {
			t.Fatal(err)
		}
		if err := mgr.Firewall().Remove(ctx, made[repair-1].HostIf); err != nil {
			t.Fatal(err)
		}
		for _, i := range []int{madeNew, gone} {
			if err := mgr.Destroy(ctx, i); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := mgr.Create(ctx, madeNew); err != nil {
			t.Fatal(err)
		}
	})
	ctx := as(context.Background(), root, nil)

	r.wantLeased(t, "before the verification", phasegatev1.SlotState_SLOT_STATE_VERIFYING, 1, 2, 3, 4, 5)
	// No index of a lease not yet verified is handed out.
	acq, err := r.api.Acquire(ctx, &phasegatev1.AcquireRequest{Owner: "new", RequestId: "n1"})
	if err != nil || acq.GetSlot().GetIndex() <= 5 {
		t.Fatalf("Acquire during the verification = %v %v, want a slot above 5", acq, err)
	}
	if _, err := r.api.KeepAlive(ctx, &phasegatev1.KeepAliveRequest{Index: keptLive, LeaseId: r.recs[keptLive].LeaseID}); err != nil {
		t.Errorf("KeepAlive of a lease not yet verified: %v", err)
	}
	if got := r.states()[keptLive].GetState(); got != phasegatev1.SlotState_SLOT_STATE_VERIFYING {
		t.Errorf("slot %d after KeepAlive: %v, want still VERIFYING", keptLive, got)
	}
	// Release of a gone lease before the background reaches it: it is
	// verified (lost: nothing to tear down) and its index freed.
	if _, err := r.api.Release(ctx, &phasegatev1.ReleaseRequest{Index: gone, LeaseId: r.recs[gone].LeaseID}); err != nil {
		t.Fatalf("Release of a lease not yet verified: %v", err)
	}
	if s := r.d.pool.Indices().States[gone-1]; s != index.Free {
		t.Errorf("index %d after the Release of its lost lease: %v, want free", gone, s)
	}

	lc := r.verifyInBackground(t)

	r.wantLeased(t, "after the verification", phasegatev1.SlotState_SLOT_STATE_ACQUIRED, intact, repair, keptLive)
	if got := r.states()[madeNew]; got.GetState() != phasegatev1.SlotState_SLOT_STATE_LOST || !strings.Contains(got.GetLostReason(), "not the one recorded") {
		t.Errorf("slot %d made again: %v (%q), want LOST saying its namespace is not the one recorded", madeNew, got.GetState(), got.GetLostReason())
	}
	if _, err := os.Stat(r.made[madeNew-1].NetnsPath); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("what was at the lost lease's index %d is still there: %v", madeNew, err)
	}
	r.wantRepaired(t, repair)
	warnings := map[string]string{}
	for _, w := range lc.Snapshot().Warnings {
		warnings[w.Name] = w.Message
	}
	if _, ok := warnings[taskVerify]; ok {
		t.Errorf("the verification's warning outlived it: %v", warnings)
	}
	if w := warnings[warnLeasesLost]; !strings.Contains(w, fmt.Sprintf("slots [%d %d]", madeNew, gone)) {
		t.Errorf("leases-lost warning %q, want it to name slots %d and %d", w, madeNew, gone)
	}
	// The lost lease's index is the lease's until it ends.
	if s := r.d.pool.Indices().States[madeNew-1]; s == index.Free {
		t.Errorf("index %d of a lost lease is free while the lease is held", madeNew)
	}
}

// The verification after a restart destroys nothing something lives in: a
// slot whose host link was deleted gets it made again into its intact
// namespace (ACQUIRED, the new link recorded); a lost lease's index where
// a process lives in a namespace made again, or in the recorded one whose
// file was unmounted, is held, not torn down, and stays held (recorded,
// quarantined) once the lease ends.
func TestVerificationKeepsWhatLives(t *testing.T) {
	const (
		relinked = 1 // host link deleted, a process inside
		madeNew  = 2 // another namespace at its path, a process inside
		unbound  = 3 // its file unmounted, a process keeps the namespace
	)
	var procs = map[int]*exec.Cmd{}
	var ids = map[int]netns.ID{}
	r := newRestoreRig(t, 8, 3, nil, func(ctx context.Context, mgr *slot.Manager, made []*slot.Slot) {
		procs[relinked] = startIn(t, made[relinked-1].NetnsPath)
		if err := netlink.LinkDel(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: made[relinked-1].HostIfIndex}}); err != nil {
			t.Fatal(err)
		}
		if err := mgr.Destroy(ctx, madeNew); err != nil {
			t.Fatal(err)
		}
		s, err := mgr.Create(ctx, madeNew)
		if err != nil {
			t.Fatal(err)
		}
		ids[madeNew] = s.NetnsID
		procs[madeNew] = startIn(t, s.NetnsPath)
		procs[unbound] = startIn(t, made[unbound-1].NetnsPath)
		if err := unix.Unmount(made[unbound-1].NetnsPath, unix.MNT_DETACH); err != nil {
			t.Fatal(err)
		}
	})
	ctx := as(context.Background(), root, nil)
	r.verifyInBackground(t)
	st := r.states()
	if got := st[relinked].GetState(); got != phasegatev1.SlotState_SLOT_STATE_ACQUIRED {
		t.Errorf("slot %d (host link deleted): %v, want ACQUIRED", relinked, got)
	}
	if id, err := netns.Stat(r.made[relinked-1].NetnsPath); err != nil || id != r.made[relinked-1].NetnsID {
		t.Errorf("slot %d's namespace after the repair: %v %v, want %v", relinked, id, err, r.made[relinked-1].NetnsID)
	}
	idx, err := r.mgr.HostLinkIndex(relinked)
	if err != nil || idx == 0 {
		t.Fatalf("slot %d's host link after the repair: %d %v", relinked, idx, err)
	}
	if rec, ok, err := r.d.store.Get(relinked); err != nil || !ok || rec.HostIfindex != idx {
		t.Errorf("slot %d's record after the repair: ifindex %d (%v %v), want %d", relinked, rec.HostIfindex, ok, err, idx)
	}
	for _, i := range []int{madeNew, unbound} {
		if got := st[i].GetState(); got != phasegatev1.SlotState_SLOT_STATE_LOST {
			t.Errorf("slot %d: %v, want LOST", i, got)
		}
		if h, ok := r.d.held.Get(i); !ok || !h.LostLease || h.Owner != r.recs[i].Owner {
			t.Errorf("slot %d: held %+v %v, want held for its lost lease of %s", i, h, ok, r.recs[i].Owner)
		}
	}
	if id, err := netns.Stat(r.made[madeNew-1].NetnsPath); err != nil || id != ids[madeNew] {
		t.Errorf("the namespace lived in at slot %d was torn down: %v %v", madeNew, id, err)
	}
	if idx, _ := r.mgr.HostLinkIndex(unbound); idx == 0 {
		t.Errorf("the host link of slot %d, whose namespace a process keeps, was deleted", unbound)
	}
	for i, p := range procs {
		if err := p.Process.Signal(unix.Signal(0)); err != nil {
			t.Errorf("the process in slot %d: %v", i, err)
		}
	}
	// The lost lease ends: what is at its index stays held, recorded.
	if _, err := r.api.Release(ctx, &phasegatev1.ReleaseRequest{Index: madeNew, LeaseId: r.recs[madeNew].LeaseID}); err != nil {
		t.Fatal(err)
	}
	if s := r.d.pool.Indices().States[madeNew-1]; s != index.Quarantined {
		t.Errorf("index %d after its lost lease ended: %v, want quarantined", madeNew, s)
	}
	if rec, ok, err := r.d.store.Get(madeNew); err != nil || !ok || rec.State != leases.Held || rec.Netns != ids[madeNew] {
		t.Errorf("slot %d's record after its lost lease ended: %+v %v %v, want held", madeNew, rec, ok, err)
	}
	if h, ok := r.d.held.Get(madeNew); !ok || h.LostLease {
		t.Errorf("slot %d held after its lease ended: %+v %v", madeNew, h, ok)
	}
}

// startIn starts a long sleep in the namespace at path and waits until it
// is there; the test's end kills it.
func startIn(t *testing.T, path string) *exec.Cmd {
	t.Helper()
	want, err := netns.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("nsenter", "--net="+path, "sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var st unix.Stat_t
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", cmd.Process.Pid))
		if unix.Stat(fmt.Sprintf("/proc/%d/ns/net", cmd.Process.Pid), &st) == nil && st.Dev == want.Dev && st.Ino == want.Ino &&
			strings.TrimSpace(string(comm)) == "sleep" {
			return cmd
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("no process entered %s", path)
	return nil
}
