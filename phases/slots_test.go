package phases

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mathbits "math/bits"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace/noop"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
	"github.com/phasegate/phasegate/control"
	"github.com/phasegate/phasegate/network/egress"
	"github.com/phasegate/phasegate/network/index"
	"github.com/phasegate/phasegate/network/leases"
	"github.com/phasegate/phasegate/network/pool"
	"github.com/phasegate/phasegate/network/slot"
)

// slotsRig is a Slots service over a real pool of real slots, in a netns
// directory and with a prefix of its own, swept at the end.
type slotsRig struct {
	svc   *slotsService
	pool  *pool.Pool
	store *leases.Store
}

// newSlotsRig makes the rig with n slots, target warm, and the given
// leases lost at a restart (recorded, their index taken, no slot).
func newSlotsRig(t testing.TB, n, target int, lost ...leases.Record) *slotsRig {
	t.Helper()
	_, mgr, store := newSlotHost(t, n)
	ctx := context.Background()
	idx, err := index.New(n, nil)
	if err != nil {
		t.Fatal(err)
	}
	var restored []*lease
	var lostIdx []int
	for _, rec := range lost {
		if err := idx.Claim(rec.Index); err != nil {
			t.Fatal(err)
		}
		if err := store.Put(ctx, rec); err != nil {
			t.Fatal(err)
		}
		restored = append(restored, &lease{rec: rec, lostReason: "its namespace was gone at the restart"})
		lostIdx = append(lostIdx, rec.Index)
	}
	pl, err := pool.New(mgr, idx, pool.Options{Target: target, Lost: lostIdx})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pl.Close(context.Background()) })
	if err := pl.WaitReady(ctx, target); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	return &slotsRig{svc: newSlotsService(mgr, pl, newSlotRecords(store, log), newLeaseTable(restored), log, noop.NewTracerProvider().Tracer(""), nil, nil), pool: pl, store: store}
}

// newSlotHost makes a slot manager for n slots in a netns directory and
// with a prefix and CIDR of its own, swept at the end, and a state file.
// Its egress defaults are the daemon's without the host's addresses.
func newSlotHost(t testing.TB, n int) (slot.Config, *slot.Manager, *leases.Store) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces)")
	}
	// A /31 per slot, in whole /24s.
	bits := max(8, mathbits.Len(uint(2*n-1)))
	blocks := 1 << (bits - 8)
	prefix := "ph"
	for range 4 {
		prefix += string(rune('a' + rand.IntN(26)))
	}
	cfg := slot.Config{
		Prefix: prefix + "-", NetnsDir: filepath.Join(t.TempDir(), "netns"), Slots: n,
		CIDR: netip.MustParsePrefix(fmt.Sprintf("100.%d.%d.0/%d", 64+rand.IntN(64), rand.IntN(256)&^(blocks-1), 32-bits)),
	}
	ctx := context.Background()
	opts := slot.DefaultOptions()
	opts.Egress = egress.Defaults{AlwaysDeny: egress.DefaultAlwaysDeny} // the daemon's, without the host's addresses
	mgr, err := slot.NewManager(ctx, cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if inv, err := mgr.Scan(ctx); err == nil {
			if res := mgr.Teardown(ctx, inv, slot.TeardownOptions{}); res.Err() != nil {
				t.Errorf("sweep: %v", res.Err())
			}
		} else {
			t.Errorf("sweep: %v", err)
		}
		if err := mgr.Firewall().Delete(ctx); err != nil {
			t.Errorf("sweep: %v", err)
		}
		for unix.Unmount(cfg.NetnsDir, unix.MNT_DETACH) == nil {
		}
	})
	store, err := leases.Open(filepath.Join(t.TempDir(), StateFileName), leases.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	return cfg, mgr, store
}

// Principals of the tests: root on the socket, and two unprivileged users.
var (
	root   = control.Principal{Kind: control.Unix}
	alice  = control.Principal{Kind: control.Unix, UID: 1001, GID: 1001}
	mallet = control.Principal{Kind: control.Unix, UID: 65534, GID: 65534}
)

// as returns ctx as the guard leaves it for a call of pr under policy p
// (nil: no rule, root alone may act).
func as(ctx context.Context, pr control.Principal, p *control.Policy) context.Context {
	if p == nil {
		p = &control.Policy{}
	}
	return control.WithCaller(ctx, control.Caller{Principal: pr, Grant: p.Grant(pr)})
}

// A caller whose deadline ends as its slot is taken from the pool gets an
// error, and the slot goes back to the pool: before, it stayed handed out,
// unrecorded and unreleasable until a restart.
func TestAcquireWhoseCallerLeftLeaksNothing(t *testing.T) {
	r := newSlotsRig(t, 4, 1)
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // the caller is gone by the time the slot would be recorded
	_, err := r.svc.Acquire(as(ctx, root, nil), &phasegatev1.AcquireRequest{Owner: "late", RequestId: "r1"})
	if status.Code(err) != codes.Canceled {
		t.Fatalf("Acquire = %v, want Canceled", err)
	}
	s := r.pool.Snapshot()
	if len(s.InUse) != 0 || len(s.Idle) != 1 {
		t.Fatalf("pool after an abandoned Acquire: in use %v, idle %v; want the slot back idle", s.InUse, s.Idle)
	}
	if recs, err := r.store.Load(); err != nil || len(recs) != 0 {
		t.Fatalf("records after an abandoned Acquire: %v %v", recs, err)
	}
	// The slot is leasable again, by a caller that stays.
	resp, err := r.svc.Acquire(as(context.Background(), root, nil), &phasegatev1.AcquireRequest{Owner: "next", RequestId: "r2"})
	if err != nil || resp.GetSlot().GetIndex() != uint32(s.Idle[0]) {
		t.Fatalf("Acquire after it: %v %v", resp, err)
	}
}

// A TTL that is set must be positive: a negative or zero one (a client's
// arithmetic gone wrong) is InvalidArgument, and leases nothing, rather
// than a lease held until released; an unset TTL is that, and a positive
// one expires.
func TestAcquireRefusesATTLNotPositive(t *testing.T) {
	r := newSlotsRig(t, 4, 1)
	ctx := as(context.Background(), root, nil)
	for _, ttl := range []*durationpb.Duration{durationpb.New(-5 * time.Second), durationpb.New(0), {Seconds: 1, Nanos: -1}} {
		resp, err := r.svc.Acquire(ctx, &phasegatev1.AcquireRequest{Owner: "o", RequestId: "neg", Ttl: ttl})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "must be a positive duration") {
			t.Errorf("Acquire with ttl %v: %v %v, want InvalidArgument", ttl, resp, err)
		}
	}
	if recs, err := r.store.Load(); err != nil || len(recs) != 0 {
		t.Fatalf("records after the refused Acquires: %v %v", recs, err)
	}
	resp, err := r.svc.Acquire(ctx, &phasegatev1.AcquireRequest{Owner: "o", RequestId: "pos", Ttl: durationpb.New(time.Minute)})
	if err != nil || resp.GetSlot().GetExpiresAt() == nil {
		t.Fatalf("Acquire with a TTL: %v %v, want a lease that expires", resp, err)
	}
	resp, err = r.svc.Acquire(ctx, &phasegatev1.AcquireRequest{Owner: "o", RequestId: "unset"})
	if err != nil || resp.GetSlot().GetExpiresAt() != nil {
		t.Fatalf("Acquire without a TTL: %v %v, want a lease held until released", resp, err)
	}
}

// A lease that cannot be recorded (the state filesystem is full) is not
// handed out: ResourceExhausted, and the slot goes back to the pool.
func TestAcquireOnAFullStateFilesystem(t *testing.T) {
	r := newSlotsRig(t, 32, 1)
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "mode=0700,size=64k"); err != nil { // 0700: a state directory only root controls
		t.Fatalf("mount a small tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	store, err := leases.Open(filepath.Join(dir, StateFileName), leases.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	r.svc.records = newSlotRecords(store, r.svc.log)
	// Fill the filesystem.
	f, err := os.Create(filepath.Join(dir, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := f.Write(make([]byte, 4096)); err != nil {
			if !errors.Is(err, unix.ENOSPC) {
				t.Fatal(err)
			}
			break
		}
	}
	f.Close()
	// bbolt reuses the pages it has: leases with long owners and request
	// ids soon need pages the filesystem cannot give.
	long := strings.Repeat("x", 250)
	for i := range 32 {
		_, err = r.svc.Acquire(as(context.Background(), root, nil), &phasegatev1.AcquireRequest{Owner: long, RequestId: fmt.Sprint(long[:240], i)})
		if err != nil {
			break
		}
	}
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("Acquire on a full filesystem: %v, want ResourceExhausted", err)
	}
	if s := r.pool.Snapshot(); len(s.InUse) != len(r.svc.table.leased) {
		t.Fatalf("a slot is handed out unrecorded: pool in use %v, leases %d", s.InUse, len(r.svc.table.leased))
	}
}

// A lost lease's release gives its index back through the pool, which
// owns the indices: the index is free at once (no slot to tear down), and
// only once.
func TestReleaseOfALostLeaseFreesItsIndex(t *testing.T) {
	now := time.Now().Round(0)
	rec := leases.Record{Index: 3, State: leases.Leased, Owner: "o", LeaseID: leases.NewLeaseID(), Principal: root.String(),
		Acquired: now, Created: now}
	r := newSlotsRig(t, 4, 1, rec)
	ctx := as(context.Background(), root, nil)
	got, err := r.svc.Get(ctx, &phasegatev1.GetRequest{Index: 3})
	if err != nil || got.GetSlot().GetState() != phasegatev1.SlotState_SLOT_STATE_LOST {
		t.Fatalf("Get of the lost lease's slot = %v %v, want LOST", got, err)
	}
	if _, err := r.svc.Release(ctx, &phasegatev1.ReleaseRequest{Index: 3, LeaseId: rec.LeaseID}); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if st := r.pool.Indices().States[2]; st != index.Free {
		t.Errorf("index 3 after the release is %v, want free", st)
	}
	if err := r.pool.PutLost(3); !errors.Is(err, pool.ErrNotFromPool) {
		t.Errorf("a second PutLost = %v, want ErrNotFromPool", err)
	}
	if _, err := r.svc.Release(ctx, &phasegatev1.ReleaseRequest{Index: 3, LeaseId: rec.LeaseID}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("a second Release = %v, want FailedPrecondition", err)
	}
}

// A retried Acquire is answered from the service's own leases, without a
// read of the store: the same request gets the same lease while it is
// held (a lost one included, answered LOST), a fresh one once it was
// released, and another request of the same owner a lease of its own.
func TestAcquireRetryFindsTheLeaseItsRequestTook(t *testing.T) {
	now := time.Now().Round(0)
	lost := leases.Record{Index: 4, State: leases.Leased, Owner: "o", LeaseID: leases.NewLeaseID(), RequestID: "lost-1",
		Principal: root.String(), Acquired: now, Created: now}
	r := newSlotsRig(t, 4, 2, lost)
	ctx := as(context.Background(), root, nil)
	acquire := func(req string) *phasegatev1.AcquireResponse {
		t.Helper()
		resp, err := r.svc.Acquire(ctx, &phasegatev1.AcquireRequest{Owner: "o", RequestId: req})
		if err != nil {
			t.Fatalf("Acquire %q: %v", req, err)
		}
		return resp
	}
	first := acquire("r1")
	other := acquire("r2")
	retry := acquire("r1")
	if retry.GetLeaseId() != first.GetLeaseId() || retry.GetSlot().GetIndex() != first.GetSlot().GetIndex() {
		t.Errorf("retry of r1 = slot %d lease %s, want slot %d lease %s", retry.GetSlot().GetIndex(), retry.GetLeaseId(),
			first.GetSlot().GetIndex(), first.GetLeaseId())
	}
	if other.GetLeaseId() == first.GetLeaseId() || other.GetSlot().GetIndex() == first.GetSlot().GetIndex() {
		t.Errorf("r2 got r1's lease (slot %d)", other.GetSlot().GetIndex())
	}
	if got := acquire("lost-1"); got.GetLeaseId() != lost.LeaseID || got.GetSlot().GetState() != phasegatev1.SlotState_SLOT_STATE_LOST {
		t.Errorf("retry of the lost lease's request = lease %s state %v, want %s LOST", got.GetLeaseId(), got.GetSlot().GetState(), lost.LeaseID)
	}
	if _, err := r.svc.Release(ctx, &phasegatev1.ReleaseRequest{Index: first.GetSlot().GetIndex(), LeaseId: first.GetLeaseId()}); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if again := acquire("r1"); again.GetLeaseId() == first.GetLeaseId() {
		t.Errorf("r1 after its release got the released lease %s again", again.GetLeaseId())
	}
	if rec, ok, err := r.store.ByRequest("o", "r1"); err != nil || !ok || rec.LeaseID == first.GetLeaseId() {
		t.Errorf("the store's record of r1 = %+v %v %v, want the new lease", rec, ok, err)
	}
}
