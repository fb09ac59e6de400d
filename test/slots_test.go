package test

import (
	"context"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
)

func TestSlotsAPIAndKillNineRestart(t *testing.T) {
	h := newHost(t)
	addr := freePort(t)
	d := start(t, nil, h.args(addr, "--slots=64")...)
	d.waitServing(time.Minute)
	conn := dial(t, addr)
	c := phasegatev1.NewSlotsClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// Bad arguments leave the state unchanged.
	before := listSlots(t, conn, true)
	bad := []struct {
		name string
		call func() error
		code codes.Code
	}{
		{"acquire without owner", func() error { _, err := c.Acquire(ctx, &phasegatev1.AcquireRequest{}); return err }, codes.InvalidArgument},
		{"acquire with a huge owner", func() error {
			_, err := c.Acquire(ctx, &phasegatev1.AcquireRequest{Owner: strings.Repeat("x", 300)})
			return err
		}, codes.InvalidArgument},
		{"acquire with a control character", func() error {
			_, err := c.Acquire(ctx, &phasegatev1.AcquireRequest{Owner: "a\x00b"})
			return err
		}, codes.InvalidArgument},
		{"release index 0", func() error { _, err := c.Release(ctx, &phasegatev1.ReleaseRequest{}); return err }, codes.InvalidArgument},
		{"release unknown index", func() error { _, err := c.Release(ctx, &phasegatev1.ReleaseRequest{Index: 65}); return err }, codes.NotFound},
		{"release a free slot", func() error { _, err := c.Release(ctx, &phasegatev1.ReleaseRequest{Index: 60}); return err }, codes.FailedPrecondition},
		{"get index 0", func() error { _, err := c.Get(ctx, &phasegatev1.GetRequest{}); return err }, codes.InvalidArgument},
		{"get unknown index", func() error { _, err := c.Get(ctx, &phasegatev1.GetRequest{Index: 1 << 30}); return err }, codes.NotFound},
	}
	for _, tc := range bad {
		if got := status.Code(tc.call()); got != tc.code {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.code)
		}
	}
	if after := listSlots(t, conn, true); len(after) != len(before) {
		t.Errorf("bad calls changed the slots: %d before, %d after", len(before), len(after))
	}

	// Acquire two slots and look at them on the host.
	var held []*phasegatev1.Slot
	for _, owner := range []string{"sandbox-a", "sandbox-b"} {
		resp, err := c.Acquire(ctx, &phasegatev1.AcquireRequest{Owner: owner})
		if err != nil {
			t.Fatalf("Acquire(%s): %v", owner, err)
		}
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
	got, err := c.Get(ctx, &phasegatev1.GetRequest{Index: held[0].GetIndex()})
	if err != nil || got.GetSlot().GetOwner() != "sandbox-a" {
		t.Fatalf("Get = %v, %v", got, err)
	}
	if _, err := c.Release(ctx, &phasegatev1.ReleaseRequest{Index: held[1].GetIndex()}); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if _, err := c.Release(ctx, &phasegatev1.ReleaseRequest{Index: held[1].GetIndex()}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("double release: %v, want FailedPrecondition", err)
	}
	resp, err := c.Acquire(ctx, &phasegatev1.AcquireRequest{Owner: "sandbox-c"})
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
	if want := "pid " + strconv.Itoa(d.cmd.Process.Pid); !strings.Contains(second.logs.String(), want) {
		t.Errorf("second daemon said %q, want it to name %s", second.logs.String(), want)
	}

	// kill -9 with slots acquired and warm: everything leaks...
	d.signal(syscall.SIGKILL)
	d.wait(10 * time.Second)
	leaked := len(h.netnsFiles(h.prefix))
	if leaked < 2 {
		t.Fatalf("only %d netns files after kill -9; expected the acquired and warm slots to leak", leaked)
	}
	// ...and the next start reclaims it all and serves again.
	d2 := start(t, nil, h.args(addr, "--slots=64")...)
	d2.waitServing(time.Minute)
	if !strings.Contains(d2.logs.String(), "found="+strconv.Itoa(leaked)) {
		t.Errorf("restart did not report the %d leaked slots:\n%s", leaked, grepLines(d2.logs.String(), "reclaim report"))
	}
	conn2 := dial(t, addr)
	for _, s := range listSlots(t, conn2, false) {
		if s.GetState() == phasegatev1.SlotState_SLOT_STATE_ACQUIRED || s.GetState() == phasegatev1.SlotState_SLOT_STATE_QUARANTINED {
			t.Errorf("after restart slot %d is %v", s.GetIndex(), s.GetState())
		}
	}
	d2.signal(syscall.SIGTERM)
	if code := d2.wait(30 * time.Second); code != 0 {
		t.Fatalf("exit %d after SIGTERM, want 0", code)
	}
	h.stoppedCleanly(h.prefix, nil)
}

func TestSIGTERMDuringStartupStopsCleanly(t *testing.T) {
	h := newHost(t)
	h.leak(h.prefix, 1, 800)
	addr := freePort(t)
	d := start(t, nil, h.args(addr, "--slots=1000")...)
	waitFor(t, 10*time.Second, "the port", func() bool { _, _, err := d.get("/livez"); return err == nil })
	d.signal(syscall.SIGTERM)
	if code := d.wait(time.Minute); code != 0 {
		t.Fatalf("exit %d after SIGTERM during startup, want 0:\n%s", code, d.logs.String())
	}
	// Whatever reclaim had not done yet is still there for the next start;
	// what this run made is gone.
	d2 := start(t, nil, h.args(addr, "--slots=1000")...)
	d2.waitServing(time.Minute)
	d2.signal(syscall.SIGTERM)
	if code := d2.wait(30 * time.Second); code != 0 {
		t.Fatalf("second run exit %d", code)
	}
	h.stoppedCleanly(h.prefix, nil)
}

// TestSerialBaselineBindsLast checks the benchmark baseline really is the
// seed's order: no answer on the port until reclaim and populate are done.
func TestSerialBaselineBindsLast(t *testing.T) {
	h := newHost(t)
	h.leak(h.prefix, 1, 40)
	addr := freePort(t)
	d := start(t, nil, h.args(addr, "--slots=64", "--serial-baseline")...)
	var firstState string
	waitFor(t, time.Minute, "the port", func() bool {
		_, body, err := d.get("/debug/lifecycle")
		if err == nil {
			firstState = body
		}
		return err == nil
	})
	// By the time the port answers, reclaim and populate have ended.
	for _, phase := range []string{"reclaim", "storage", "populate"} {
		i := strings.Index(firstState, `"name": "`+phase+`"`)
		if i < 0 || !strings.Contains(firstState[i:i+400], `"state": "succeeded"`) {
			t.Errorf("port answered before %s succeeded", phase)
		}
	}
	d.waitServing(time.Minute)
	d.signal(syscall.SIGTERM)
	if code := d.wait(30 * time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	h.stoppedCleanly(h.prefix, nil)
}
