package test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
)

// held is a lease a client was told about, and the identity of its
// namespace when it was told.
type held struct {
	owner, requestID, leaseID string
	slot                      *phasegatev1.Slot
	netns                     uint64 // the inode of slot's netns file
}

func acquire(t *testing.T, c phasegatev1.SlotsClient, owner, requestID string, ttl time.Duration) held {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req := &phasegatev1.AcquireRequest{Owner: owner, RequestId: requestID}
	if ttl > 0 {
		req.Ttl = durationpb.New(ttl)
	}
	resp, err := c.Acquire(ctx, req)
	if err != nil {
		t.Fatalf("Acquire(%s, %s): %v", owner, requestID, err)
	}
	if resp.GetLeaseId() == "" || resp.GetSlot().GetState() != phasegatev1.SlotState_SLOT_STATE_ACQUIRED {
		t.Fatalf("Acquire(%s): %v", owner, resp)
	}
	h, err := heldOf(owner, requestID, resp)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// heldOf is what a client holds after Acquire answered resp.
func heldOf(owner, requestID string, resp *phasegatev1.AcquireResponse) (held, error) {
	var st unix.Stat_t
	if err := unix.Stat(resp.GetSlot().GetNetnsPath(), &st); err != nil {
		return held{}, fmt.Errorf("slot %d acquired by %s: stat its netns: %w", resp.GetSlot().GetIndex(), owner, err)
	}
	return held{owner: owner, requestID: requestID, leaseID: resp.GetLeaseId(), slot: resp.GetSlot(), netns: st.Ino}, nil
}

// checkLeases checks, once no lease is still being verified after a
// restart, that every lease a client was told about is held by its owner,
// described as Acquire described it (the expiry aside: a restart renews
// it) over the same namespace, and that no index is held twice.
func checkLeases(t *testing.T, c phasegatev1.SlotsClient, want []held, when string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var list *phasegatev1.ListResponse
	waitFor(t, time.Minute, when+": every restored lease verified", func() bool {
		var err error
		if list, err = c.List(ctx, &phasegatev1.ListRequest{}); err != nil {
			t.Fatalf("%s: List: %v", when, err)
		}
		return !slices.ContainsFunc(list.GetSlots(), func(s *phasegatev1.Slot) bool {
			return s.GetState() == phasegatev1.SlotState_SLOT_STATE_VERIFYING
		})
	})
	listed := map[uint32]*phasegatev1.Slot{}
	for _, s := range list.GetSlots() {
		if s.GetState() == phasegatev1.SlotState_SLOT_STATE_ACQUIRED {
			if _, dup := listed[s.GetIndex()]; dup {
				t.Errorf("%s: slot %d listed twice", when, s.GetIndex())
			}
			listed[s.GetIndex()] = s
		}
	}
	for _, h := range want {
		got := listed[h.slot.GetIndex()]
		if got.GetOwner() != h.owner {
			t.Errorf("%s: slot %d is held by %q, the client was told %q", when, h.slot.GetIndex(), got.GetOwner(), h.owner)
			continue
		}
		told := proto.Clone(h.slot).(*phasegatev1.Slot)
		got = proto.Clone(got).(*phasegatev1.Slot)
		// Acquire told no usage: List's is what crossed since.
		told.ExpiresAt, got.ExpiresAt, got.Usage = nil, nil, nil
		if !proto.Equal(told, got) {
			t.Errorf("%s: slot %d is listed as\n%v\nthe client was told\n%v", when, h.slot.GetIndex(), got, told)
		}
		var st unix.Stat_t
		if err := unix.Stat(h.slot.GetNetnsPath(), &st); err != nil || st.Ino != h.netns {
			t.Errorf("%s: slot %d's namespace is inode %d (%v), the client was given %d", when, h.slot.GetIndex(), st.Ino, err, h.netns)
		}
	}
	if len(listed) != len(want) {
		t.Errorf("%s: %d slots leased, the clients hold %d", when, len(listed), len(want))
	}
}

// leaseSixOwners acquires six leases for four owners, every other one
// with a TTL.
func leaseSixOwners(t *testing.T, c phasegatev1.SlotsClient) []held {
	t.Helper()
	var leases []held
	for i, owner := range []string{"sandbox-a", "sandbox-a", "sandbox-b", "ci-job-7", "ci-job-8", "sandbox-c"} {
		ttl := time.Duration(0)
		if i%2 == 1 {
			ttl = 10 * time.Minute // kept alive by its owner in real life; long enough here
		}
		leases = append(leases, acquire(t, c, owner, fmt.Sprintf("req-%d", i), ttl))
	}
	return leases
}

// A restart of the daemon, by kill -9, SIGTERM or an in-place upgrade,
// never touches a running workload: every lease comes back with its owner,
// the workloads answer over their veth the whole time (the daemon being
// down included), and no index is ever held by two owners.
func TestLiveRestoreKeepsWorkloadsConnected(t *testing.T) {
	h := newHost(t)
	addr := freePort(t)
	args := h.args(addr, "--slots=64", "--drain-delay=100ms")
	d := start(t, nil, args...)
	d.waitServing(time.Minute)
	c := d.slots()

	leases := leaseSixOwners(t, c)
	// Real workloads in three of the slots, probed from the host.
	var work []*workload
	for _, l := range leases[:3] {
		inside, _, _ := strings.Cut(l.slot.GetInsideAddress(), "/")
		work = append(work, startWorkload(t, l.slot.GetIndex(), l.slot.GetNetnsPath(), inside))
	}
	checkLeases(t, c, leases, "before the restarts")

	restart := func(name string, stop func()) {
		t.Helper()
		stop()
		d = start(t, nil, args...)
		d.waitServing(time.Minute)
		c = d.slots()
		checkLeases(t, c, leases, "after "+name)
		if !strings.Contains(d.Output(), fmt.Sprintf("restored %d leases", len(leases))) {
			t.Errorf("after %s the start does not report %d restored leases:\n%s", name, len(leases), grepLines(d.Output(), "restore"))
		}
	}
	restart("kill -9", func() {
		d.signal(syscall.SIGKILL)
		d.wait(30 * time.Second)
		time.Sleep(200 * time.Millisecond) // down a while: the workloads must not notice
	})
	restart("SIGTERM", func() {
		d.signal(syscall.SIGTERM)
		if code := d.wait(time.Minute); code != 0 {
			t.Fatalf("exit %d", code)
		}
	})
	// An in-place upgrade: same process, same leases.
	before := strings.Count(d.Output(), "msg=serving ")
	d.signal(syscall.SIGHUP)
	waitFor(t, 2*time.Minute, "the upgraded daemon to serve", func() bool {
		return strings.Count(d.Output(), "msg=serving ") > before
	})
	d.waitServing(time.Minute)
	c = d.slots()
	checkLeases(t, c, leases, "after an upgrade")

	// A retried request gets its slot and lease again, never a second one.
	again := acquire(t, c, leases[2].owner, leases[2].requestID, 0)
	if again.slot.GetIndex() != leases[2].slot.GetIndex() || again.leaseID != leases[2].leaseID {
		t.Errorf("retried request got slot %d lease %s, first got %d %s", again.slot.GetIndex(), again.leaseID,
			leases[2].slot.GetIndex(), leases[2].leaseID)
	}
	checkLeases(t, c, leases, "after a retried Acquire")

	for _, w := range work {
		ok, failed, last := w.finish()
		t.Logf("workload in slot %d: %d probes answered, %d failed", w.slot, ok, failed)
		if failed != 0 || ok == 0 {
			t.Errorf("workload in slot %d lost its network: %d probes failed (last: %v), %d answered", w.slot, failed, last, ok)
		}
	}
	writeReport(t, "restore.txt", fmt.Sprintf("%d leases (3 with workloads probed every 20 ms) across kill -9, SIGTERM and SIGHUP restarts: all restored to their owners, no probe failed\n", len(leases)))

	d.signal(syscall.SIGTERM)
	if code := d.wait(time.Minute); code != 0 {
		t.Fatalf("exit %d", code)
	}
	checkLeasesRecordedAndKept(t, h, len(leases))
	h.decommission(h.prefix)
	h.assertClean(h.prefix, nil)
}

// checkLeasesRecordedAndKept checks the stopped daemon recorded n leased
// slots, and that decommissioning refuses while they exist, unless told.
func checkLeasesRecordedAndKept(t *testing.T, h *host, n int) {
	t.Helper()
	recs := h.assertOnlyRecorded(h.prefix)
	leased := 0
	for _, r := range recs {
		if r.State.String() == "leased" {
			leased++
		}
	}
	if leased != n {
		t.Errorf("%d leased records after the final stop, want %d", leased, n)
	}
	// Decommissioning refuses while leases exist, unless told.
	out, err := runBinary("decommission", "--netns-dir="+h.netnsDir, "--slot-prefix="+h.prefix, "--slots=64", "--state-dir="+h.stateDir)
	if err == nil || !strings.Contains(out, "refused") || !strings.Contains(out, "sandbox-a") {
		t.Errorf("decommission with leases: err %v\n%s", err, out)
	}
}

// Leases end: with Release (the lease id is required, a wrong one changes
// nothing), or when their TTL runs out without a KeepAlive; a KeepAlive
// keeps one.
func TestLeaseLifecycle(t *testing.T) {
	h := newHost(t)
	addr := freePort(t)
	d := start(t, nil, h.args(addr, "--slots=64")...)
	d.waitServing(time.Minute)
	c := d.slots()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	a := acquire(t, c, "owner-a", "r1", 0)
	for _, tc := range []struct {
		name    string
		leaseID string
		code    codes.Code
	}{
		{"no lease id", "", codes.PermissionDenied},
		{"another lease id", strings.Repeat("0", 32), codes.PermissionDenied},
	} {
		if _, err := c.Release(ctx, &phasegatev1.ReleaseRequest{Index: a.slot.GetIndex(), LeaseId: tc.leaseID}); status.Code(err) != tc.code {
			t.Errorf("Release with %s: %v, want %v", tc.name, err, tc.code)
		}
	}
	checkLeases(t, c, []held{a}, "after refused releases")
	if _, err := c.Release(ctx, &phasegatev1.ReleaseRequest{Index: a.slot.GetIndex(), LeaseId: a.leaseID}); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if _, err := c.Release(ctx, &phasegatev1.ReleaseRequest{Index: a.slot.GetIndex(), LeaseId: a.leaseID}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("second Release: %v, want FailedPrecondition", err)
	}

	short := acquire(t, c, "owner-b", "r2", 2*time.Second)
	kept := acquire(t, c, "owner-c", "r3", 2*time.Second)
	deadline := time.Now().Add(6 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := c.KeepAlive(ctx, &phasegatev1.KeepAliveRequest{Index: kept.slot.GetIndex(), LeaseId: kept.leaseID}); err != nil {
			t.Fatalf("KeepAlive: %v", err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	checkLeases(t, c, []held{kept}, "after the short lease's TTL")
	if !strings.Contains(d.Output(), "lease expired") {
		t.Errorf("no log line for the expired lease")
	}
	got, err := c.Get(ctx, &phasegatev1.GetRequest{Index: short.slot.GetIndex()})
	if err != nil || got.GetSlot().GetState() == phasegatev1.SlotState_SLOT_STATE_ACQUIRED {
		t.Errorf("expired lease's slot: %v %v", got, err)
	}
	if _, err := c.KeepAlive(ctx, &phasegatev1.KeepAliveRequest{Index: short.slot.GetIndex(), LeaseId: short.leaseID}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("KeepAlive of an expired lease: %v, want FailedPrecondition", err)
	}
	d.signal(syscall.SIGTERM)
	if code := d.wait(time.Minute); code != 0 {
		t.Fatalf("exit %d", code)
	}
	h.stoppedCleanly(h.prefix, nil)
}
