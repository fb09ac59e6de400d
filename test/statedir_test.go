package test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
)

// stateTmpfs mounts a tmpfs of size bytes as h's state directory (0700,
// root's, as the daemon wants it), unmounted before the test's
// directories are removed.
func (h *host) stateTmpfs(size int) {
	h.t.Helper()
	if err := os.MkdirAll(h.stateDir, 0o700); err != nil {
		h.t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", h.stateDir, "tmpfs", 0, fmt.Sprintf("mode=0700,size=%d", size)); err != nil {
		h.t.Fatalf("mount a tmpfs on %s: %v", h.stateDir, err)
	}
	h.t.Cleanup(func() {
		if err := unix.Unmount(h.stateDir, unix.MNT_DETACH); err != nil {
			h.t.Errorf("unmount %s: %v", h.stateDir, err)
		}
	})
}

// remountState changes the state tmpfs's options (ro, rw, size=…).
func (h *host) remountState(opts string) {
	h.t.Helper()
	run(h.t, "mount", "-o", "remount,"+opts, h.stateDir)
}

// idleSlots is the daemon's count of warm slots.
func (d *daemon) idleSlots() float64 {
	return metricValue(scrapeMetrics(d.t, d), "phasegate_pool_slots", "state", "idle")
}

// A state filesystem that fills up is a component of health, naming the
// directory and the fault; failed Acquires do not drain the warm pool; a
// start on the full disk serves degraded (every lease listed, health
// saying why) instead of exiting; once there is space again, a release
// goes through, the warning goes, the pool refills. The workloads and
// their namespaces are untouched throughout. On 3e89cc8 health said pass,
// each failed Acquire destroyed a warm slot, and the start exited 1 from
// reclaim (the restored leases' fresh TTLs could not be written).
func TestFullStateFilesystem(t *testing.T) {
	h := newHost(t)
	h.stateTmpfs(40 << 10)
	args := h.args(freePort(t), "--slots=200", "--pool-size=2")
	d := start(t, nil, args...)
	d.waitServing(time.Minute)
	c := d.slots()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	// Leases with long names and a TTL (a restart renews TTLs, a write)
	// until the records fill the filesystem.
	long := strings.Repeat("x", 120)
	leases := leaseUntilFull(t, ctx, c, long)
	t.Logf("the state filesystem was full after %d leases", len(leases))
	var work []*workload
	for _, l := range leases[:2] {
		inside, _, _ := strings.Cut(l.slot.GetInsideAddress(), "/")
		work = append(work, startWorkload(t, l.slot.GetIndex(), l.slot.GetNetnsPath(), inside))
	}
	w := d.warning("state-dir")
	if !strings.Contains(w, h.stateDir) || !strings.Contains(w, "filesystem is full") {
		t.Errorf("full: the state-dir warning is %q, want it to name %s and the lack of space", w, h.stateDir)
	}
	if _, body, _ := d.get("/health"); !strings.Contains(body, `"status":"warn"`) {
		t.Errorf("full: /health is not warn: %s", body)
	}

	failedAcquiresKeepThePool(t, ctx, d, c, long)
	// A release that cannot be recorded is refused, and the lease kept.
	last := leases[len(leases)-1]
	if _, err := c.Release(ctx, &phasegatev1.ReleaseRequest{Index: last.slot.GetIndex(), LeaseId: last.leaseID}); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("Release on a full state filesystem: %v, want ResourceExhausted", err)
	}
	checkLeases(t, c, leases, "on a full state filesystem")

	// A start on the full disk serves, degraded.
	d.signal(syscall.SIGKILL)
	d.wait(30 * time.Second)
	d = start(t, nil, args...)
	d.waitServing(30 * time.Second) // 3e89cc8: exit 1 from reclaim
	c = d.slots()
	checkLeases(t, c, leases, "after a start on a full state filesystem")
	waitFor(t, 30*time.Second, "the state-dir warning after the start", func() bool { return d.warning("state-dir") != "" })
	if w := d.warning("state-dir"); !strings.Contains(w, h.stateDir) || !strings.Contains(w, "full") {
		t.Errorf("after the start, the state-dir warning is %q", w)
	}

	// Space again: a release goes through, the warning goes, the pool
	// refills, an Acquire works.
	h.remountState("size=4m")
	if _, err := c.Release(ctx, &phasegatev1.ReleaseRequest{Index: last.slot.GetIndex(), LeaseId: last.leaseID}); err != nil {
		t.Fatalf("Release with space again: %v", err)
	}
	leases = leases[:len(leases)-1]
	waitFor(t, 30*time.Second, "the state-dir warning to go", func() bool { return d.warning("state-dir") == "" })
	waitFor(t, time.Minute, "the warm pool refilled", func() bool { return d.idleSlots() >= 2 })
	leases = append(leases, acquire(t, c, "tenant-after", "after", 0))
	checkLeases(t, c, leases, "with space again")
	for _, w := range work {
		if ok, failed, lastErr := w.finish(); failed != 0 || ok == 0 {
			t.Errorf("workload in slot %d lost its network: %d probes failed (last: %v), %d answered", w.slot, failed, lastErr, ok)
		}
	}
	d.signal(syscall.SIGTERM)
	if code := d.wait(time.Minute); code != 0 {
		t.Fatalf("exit %d", code)
	}
	h.decommission(h.prefix)
	h.assertClean(h.prefix, nil)
}

// leaseUntilFull acquires leases whose owner and request id carry long,
// each with a TTL, until the state filesystem is full: the refusal must
// be ResourceExhausted, after at least two leases, which it returns.
func leaseUntilFull(t *testing.T, ctx context.Context, c phasegatev1.SlotsClient, long string) []held {
	t.Helper()
	var leases []held
	var full error
	for i := range 200 {
		owner, req := fmt.Sprintf("tenant-%d-%s", i, long), fmt.Sprintf("req-%d-%s", i, long)
		resp, err := c.Acquire(ctx, &phasegatev1.AcquireRequest{Owner: owner, RequestId: req, Ttl: durationpb.New(time.Hour)})
		if err != nil {
			full = err
			break
		}
		l, err := heldOf(owner, req, resp)
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
	}
	if status.Code(full) != codes.ResourceExhausted || len(leases) < 2 {
		t.Fatalf("after %d leases: %v, want ResourceExhausted once the state filesystem is full", len(leases), full)
	}
	return leases
}

// failedAcquiresKeepThePool makes 5 Acquires on the full state
// filesystem: each must be refused with ResourceExhausted, and the warm
// pool left as it was.
func failedAcquiresKeepThePool(t *testing.T, ctx context.Context, d *daemon, c phasegatev1.SlotsClient, long string) {
	t.Helper()
	warm := d.idleSlots()
	for i := range 5 {
		_, err := c.Acquire(ctx, &phasegatev1.AcquireRequest{Owner: "tenant-more", RequestId: fmt.Sprintf("more-%d-%s", i, long)})
		if status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("Acquire on a full state filesystem: %v, want ResourceExhausted", err)
		}
	}
	if after := d.idleSlots(); warm < 1 || after < warm {
		t.Errorf("5 failed Acquires took the warm pool from %v to %v slots", warm, after)
	}
}

// A start on a read-only state directory is refused before anything is
// locked, bound or made, as every setting no start can serve with: exit 2
// with one line that names the directory and its read-only filesystem
// (on 3e89cc8 "configuration: control socket: bind …: read-only file
// system", on 65cb2fe exit 1 after the lock phase's log), the leased slots
// and their workload untouched; once writable again, the next start
// restores every lease.
func TestReadOnlyStateDirAtStart(t *testing.T) {
	h := newHost(t)
	h.stateTmpfs(1 << 20)
	args := h.args(freePort(t), "--slots=64")
	d := start(t, nil, args...)
	d.waitServing(time.Minute)
	c := d.slots()
	leases := []held{acquire(t, c, "tenant-a", "ro-1", 0), acquire(t, c, "tenant-b", "ro-2", 0)}
	inside, _, _ := strings.Cut(leases[0].slot.GetInsideAddress(), "/")
	w := startWorkload(t, leases[0].slot.GetIndex(), leases[0].slot.GetNetnsPath(), inside)
	d.signal(syscall.SIGTERM)
	if code := d.wait(time.Minute); code != 0 {
		t.Fatalf("exit %d", code)
	}

	h.remountState("ro")
	d = start(t, nil, args...)
	if code := d.wait(time.Minute); code != 2 {
		t.Fatalf("a start on a read-only state directory: exit %d, want 2:\n%s", code, d.Output())
	}
	out := lines(d.Output())
	if l := out[len(out)-1]; len(out) != 1 || !strings.HasPrefix(l, "phasegate serve:") || !strings.Contains(l, "read-only") || !strings.Contains(l, h.stateDir) {
		t.Errorf("output %q, want one line naming the state directory and its read-only filesystem", out)
	}
	for _, l := range leases {
		var st unix.Stat_t
		if err := unix.Stat(l.slot.GetNetnsPath(), &st); err != nil || st.Ino != l.netns {
			t.Errorf("slot %d's namespace after the refused start: %d (%v), was %d", l.slot.GetIndex(), st.Ino, err, l.netns)
		}
	}

	h.remountState("rw")
	d = start(t, nil, args...)
	d.waitServing(time.Minute)
	checkLeases(t, d.slots(), leases, "writable again")
	if ok, failed, last := w.finish(); failed != 0 || ok == 0 {
		t.Errorf("the workload lost its network: %d probes failed (last %v), %d answered", failed, last, ok)
	}
	d.signal(syscall.SIGTERM)
	if code := d.wait(time.Minute); code != 0 {
		t.Fatalf("exit %d", code)
	}
	h.decommission(h.prefix)
	h.assertClean(h.prefix, nil)
}

// The control socket removed from outside is reported within a check
// (health warn naming it), and an upgrade in place binds it again, every
// lease kept. The whole state directory removed is reported too (the
// state file the daemon holds open can no longer be found), and a
// SIGTERM still stops the daemon cleanly (exit 0), the leased slots and
// their workload untouched. On 3e89cc8 health said pass throughout and
// SIGTERM exited 1.
func TestStateDirAndControlSocketRemoved(t *testing.T) {
	h := newHost(t)
	d := start(t, nil, h.args(freePort(t), "--slots=64")...)
	d.waitServing(time.Minute)
	c := d.slots()
	leases := []held{acquire(t, c, "tenant-a", "sock-1", 0), acquire(t, c, "tenant-b", "sock-2", 0)}
	inside, _, _ := strings.Cut(leases[0].slot.GetInsideAddress(), "/")
	w := startWorkload(t, leases[0].slot.GetIndex(), leases[0].slot.GetNetnsPath(), inside)

	if err := os.Remove(d.control); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "the control-socket warning", func() bool {
		return strings.Contains(d.warning("control-socket"), d.control)
	})
	if _, body, _ := d.get("/health"); !strings.Contains(body, `"status":"warn"`) {
		t.Errorf("/health is not warn with the control socket gone: %s", body)
	}
	before := strings.Count(d.Output(), "msg=serving ")
	d.signal(syscall.SIGHUP)
	waitFor(t, time.Minute, "the upgraded daemon to serve", func() bool {
		return strings.Count(d.Output(), "msg=serving ") > before
	})
	d.waitServing(time.Minute)
	if fi, err := os.Lstat(d.control); err != nil || fi.Mode().Type() != os.ModeSocket {
		t.Fatalf("the control socket after the upgrade: %v %v", fi, err)
	}
	checkLeases(t, d.slots(), leases, "after the upgrade bound the control socket again")
	waitFor(t, 20*time.Second, "the control-socket warning to go", func() bool { return d.warning("control-socket") == "" })

	// The whole state directory.
	if err := os.RemoveAll(h.stateDir); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "the state-dir warning", func() bool {
		w := d.warning("state-dir")
		return strings.Contains(w, h.stateDir) && strings.Contains(w, filepath.Join(h.stateDir, "slots.db")+" was removed")
	})
	d.signal(syscall.SIGTERM)
	if code := d.wait(time.Minute); code != 0 {
		t.Errorf("SIGTERM with the state directory removed: exit %d, want 0", code)
	}
	for _, l := range leases {
		var st unix.Stat_t
		if err := unix.Stat(l.slot.GetNetnsPath(), &st); err != nil || st.Ino != l.netns {
			t.Errorf("slot %d's namespace after the stop: %d (%v), was %d", l.slot.GetIndex(), st.Ino, err, l.netns)
		}
	}
	if ok, failed, last := w.finish(); failed != 0 || ok == 0 {
		t.Errorf("the workload lost its network: %d probes failed (last %v), %d answered", failed, last, ok)
	}
	h.decommission(h.prefix)
	h.assertClean(h.prefix, nil)
}
