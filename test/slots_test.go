package test

import (
	"context"
	"maps"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
)

// The Slots API answers bad calls with their codes and changes nothing,
// leases slots made as the host shows them, releases once, hands the slot
// just returned out first; a second daemon on the same state is refused;
// a kill -9 with leases, warm slots and an earlier leak is followed by a
// start that restores, adopts and reclaims.
func TestSlotsAPIAndKillNineRestart(t *testing.T) {
	h := newHost(t)
	addr := freePort(t)
	d := start(t, nil, h.args(addr, "--slots=64")...)
	d.waitServing(time.Minute)
	c := d.slots()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// Bad arguments leave the state unchanged.
	before := listSlots(t, c, true)
	for _, tc := range badSlotsCalls(ctx, c) {
		if got := status.Code(tc.call()); got != tc.code {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.code)
		}
	}
	if after := listSlots(t, c, true); len(after) != len(before) {
		t.Errorf("bad calls changed the slots: %d before, %d after", len(before), len(after))
	}

	held, leaseIDs := acquireAndLookOnTheHost(t, ctx, h, c)
	got, err := c.Get(ctx, &phasegatev1.GetRequest{Index: held[0].GetIndex()})
	if err != nil || got.GetSlot().GetOwner() != "sandbox-a" {
		t.Fatalf("Get = %v, %v", got, err)
	}
	if _, err := c.Release(ctx, &phasegatev1.ReleaseRequest{Index: held[1].GetIndex(), LeaseId: leaseIDs[1]}); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if _, err := c.Release(ctx, &phasegatev1.ReleaseRequest{Index: held[1].GetIndex(), LeaseId: leaseIDs[1]}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("double release: %v, want FailedPrecondition", err)
	}
	resp, err := c.Acquire(ctx, &phasegatev1.AcquireRequest{Owner: "sandbox-c", RequestId: "c-1"})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetSlot().GetIndex() != held[1].GetIndex() {
		t.Errorf("Acquire after Release got slot %d, want the one just returned (%d): the pool is LIFO",
			resp.GetSlot().GetIndex(), held[1].GetIndex())
	}

	// A second daemon on the same state dir refuses at once, naming the pid.
	second := start(t, nil, h.args(freePort(t), "--slots=64")...)
	if code := second.wait(10 * time.Second); code != 1 {
		t.Errorf("second daemon exit %d, want 1", code)
	}
	if want := "pid " + strconv.Itoa(d.Pid()); !strings.Contains(second.Output(), want) {
		t.Errorf("second daemon said %q, want it to name %s", second.Output(), want)
	}
	if _, err := c.Get(ctx, &phasegatev1.GetRequest{Index: held[0].GetIndex()}); err != nil {
		t.Errorf("the first daemon's control socket after a second daemon was refused: %v", err)
	}

	// kill -9 with slots leased and warm, and a leak of an earlier run: the
	// next start restores the leases to their owners, adopts the warm slots
	// and reclaims the leak, and serves again.
	killNineAndRestore(t, h, d, addr, map[uint32]string{held[0].GetIndex(): "sandbox-a", resp.GetSlot().GetIndex(): "sandbox-c"})
	h.stoppedCleanly(h.prefix, nil)
}

// badSlotsCall is a call of the Slots API that must fail with code.
type badSlotsCall struct {
	name string
	call func() error
	code codes.Code
}

// badSlotsCalls are calls with bad arguments, each with the code it must
// get.
func badSlotsCalls(ctx context.Context, c phasegatev1.SlotsClient) []badSlotsCall {
	return []badSlotsCall{
		{"acquire without owner", func() error { _, err := c.Acquire(ctx, &phasegatev1.AcquireRequest{}); return err }, codes.InvalidArgument},
		{"acquire with a huge owner", func() error {
			_, err := c.Acquire(ctx, &phasegatev1.AcquireRequest{Owner: strings.Repeat("x", 300)})
			return err
		}, codes.InvalidArgument},
		{"acquire with a control character", func() error {
			_, err := c.Acquire(ctx, &phasegatev1.AcquireRequest{Owner: "a\x00b"})
			return err
		}, codes.InvalidArgument},
		{"acquire with a negative ttl", func() error {
			_, err := c.Acquire(ctx, &phasegatev1.AcquireRequest{Owner: "o", Ttl: durationpb.New(-time.Second)})
			return err
		}, codes.InvalidArgument},
		{"release index 0", func() error { _, err := c.Release(ctx, &phasegatev1.ReleaseRequest{}); return err }, codes.InvalidArgument},
		{"release unknown index", func() error {
			_, err := c.Release(ctx, &phasegatev1.ReleaseRequest{Index: 65, LeaseId: "x"})
			return err
		}, codes.NotFound},
		{"release a free slot", func() error {
			_, err := c.Release(ctx, &phasegatev1.ReleaseRequest{Index: 60, LeaseId: "x"})
			return err
		}, codes.FailedPrecondition},
		{"keepalive a free slot", func() error {
			_, err := c.KeepAlive(ctx, &phasegatev1.KeepAliveRequest{Index: 60, LeaseId: "x"})
			return err
		}, codes.FailedPrecondition},
		{"get index 0", func() error { _, err := c.Get(ctx, &phasegatev1.GetRequest{}); return err }, codes.InvalidArgument},
		{"get unknown index", func() error { _, err := c.Get(ctx, &phasegatev1.GetRequest{Index: 1 << 30}); return err }, codes.NotFound},
	}
}

// acquireAndLookOnTheHost acquires a slot for sandbox-a and sandbox-b and
// checks each on the host: its inside address, its default route via the
// host side, its host link. It returns the slots and their lease ids.
func acquireAndLookOnTheHost(t *testing.T, ctx context.Context, h *host, c phasegatev1.SlotsClient) ([]*phasegatev1.Slot, []string) {
	t.Helper()
	var held []*phasegatev1.Slot
	var leaseIDs []string
	for _, owner := range []string{"sandbox-a", "sandbox-b"} {
		resp, err := c.Acquire(ctx, &phasegatev1.AcquireRequest{Owner: owner, RequestId: owner + "-1"})
		if err != nil {
			t.Fatalf("Acquire(%s): %v", owner, err)
		}
		leaseIDs = append(leaseIDs, resp.GetLeaseId())
		s := resp.GetSlot()
		if s.GetState() != phasegatev1.SlotState_SLOT_STATE_ACQUIRED || s.GetOwner() != owner || s.GetAcquiredAt() == nil {
			t.Fatalf("acquired slot %v", s)
		}
		held = append(held, s)
		out := run(t, "nsenter", "--net="+s.GetNetnsPath(), "ip", "-o", "addr", "show", "dev", s.GetInsideInterface())
		if !strings.Contains(out, s.GetInsideAddress()) {
			t.Errorf("inside %s has %q, want address %s", s.GetInsideInterface(), out, s.GetInsideAddress())
		}
		route := run(t, "nsenter", "--net="+s.GetNetnsPath(), "ip", "route", "show", "default")
		gw, _, _ := strings.Cut(s.GetHostAddress(), "/")
		if !strings.Contains(route, "via "+gw) {
			t.Errorf("default route inside %q, want via %s", route, gw)
		}
		if links := h.links(s.GetHostInterface()); len(links) != 1 {
			t.Errorf("host interface %s: %v", s.GetHostInterface(), links)
		}
	}
	return held, leaseIDs
}

// killNineAndRestore leaks 5 slots as an earlier run would, kills d with
// SIGKILL and starts again on addr: the start must report 2 leases
// restored and 5 slots reclaimed, leave no slot quarantined or lost, list
// exactly the leases of owners (index → owner), and stop cleanly.
func killNineAndRestore(t *testing.T, h *host, d *daemon, addr string, owners map[uint32]string) {
	t.Helper()
	h.leak(h.prefix, 51, 5)
	d.signal(syscall.SIGKILL)
	d.wait(10 * time.Second)
	d2 := start(t, nil, h.args(addr, "--slots=64")...)
	d2.waitReclaimed(time.Minute)
	if !strings.Contains(d2.Output(), "restored 2 leases") || !strings.Contains(d2.Output(), "reclaimed 5") {
		t.Errorf("restart does not report 2 leases restored and 5 slots reclaimed:\n%s", grepLines(d2.Output(), "restore"))
	}
	got := map[uint32]string{}
	for _, s := range listSlots(t, d2.slots(), false) {
		switch s.GetState() {
		case phasegatev1.SlotState_SLOT_STATE_ACQUIRED:
			got[s.GetIndex()] = s.GetOwner()
		case phasegatev1.SlotState_SLOT_STATE_QUARANTINED, phasegatev1.SlotState_SLOT_STATE_LOST:
			t.Errorf("after restart slot %d is %v", s.GetIndex(), s.GetState())
		}
	}
	if !maps.Equal(got, owners) {
		t.Errorf("leases after kill -9 and restart: %v, want %v", got, owners)
	}
	d2.signal(syscall.SIGTERM)
	if code := d2.wait(30 * time.Second); code != 0 {
		t.Fatalf("exit %d after SIGTERM, want 0", code)
	}
}

// A SIGTERM while reclaim runs in the foreground of the start stops the
// daemon with exit 0; one as it serves halts the background reclaim; the
// next start reclaims the rest, and after its stop nothing is left.
func TestSIGTERMDuringStartupStopsCleanly(t *testing.T) {
	h := newHost(t)
	h.leak(h.prefix, 1, 800)
	addr := freePort(t)
	d := start(t, nil, h.args(addr, "--slots=1000")...)
	waitFor(t, 10*time.Second, "the port", func() bool { _, _, err := d.get("/livez"); return err == nil })
	d.signal(syscall.SIGTERM)
	if code := d.wait(time.Minute); code != 0 {
		t.Fatalf("exit %d after SIGTERM during startup, want 0:\n%s", code, d.Output())
	}
	// Whatever reclaim had not done yet is still there for the next start.
	// A SIGTERM as it serves halts its background reclaim at the end of
	// the batch in hand: exit 0, and the rest left for the next start.
	d2 := start(t, nil, h.args(addr, "--slots=1000")...)
	d2.waitServing(time.Minute)
	d2.signal(syscall.SIGTERM)
	if code := d2.wait(30 * time.Second); code != 0 {
		t.Fatalf("second run exit %d:\n%s", code, d2.Output())
	}
	// The third start reclaims the rest; what it made is gone after it.
	d3 := start(t, nil, h.args(addr, "--slots=1000")...)
	d3.waitReclaimed(time.Minute)
	d3.signal(syscall.SIGTERM)
	if code := d3.wait(30 * time.Second); code != 0 {
		t.Fatalf("third run exit %d", code)
	}
	h.stoppedCleanly(h.prefix, nil)
}
