package test

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
	"github.com/phasegate/phasegate/network/leases"
	"github.com/phasegate/phasegate/phases"
)

// A state file that is not a usable store is moved aside for inspection,
// said in one line, and the daemon starts in safe mode: a slot something
// lives in (it may be leased) is kept and quarantined, never destroyed,
// and its workload keeps its network; the rest is reclaimed.
func TestCorruptStateFileIsMovedAsideAndNothingInhabitedIsDestroyed(t *testing.T) {
	h := newHost(t)
	addr := freePort(t)
	args := h.args(addr, "--slots=64")
	d := start(t, nil, args...)
	d.waitServing(time.Minute)
	c := d.slots()
	busy := acquire(t, c, "sandbox-busy", "b1", 0)
	idle := acquire(t, c, "sandbox-idle", "i1", 0)
	inside, _, _ := strings.Cut(busy.slot.GetInsideAddress(), "/")
	w := startWorkload(t, busy.slot.GetIndex(), busy.slot.GetNetnsPath(), inside)
	d.signal(syscall.SIGKILL)
	d.wait(10 * time.Second)

	state := filepath.Join(h.stateDir, phases.StateFileName)
	if err := os.WriteFile(state, []byte(strings.Repeat("not a database\n", 1000)), 0o600); err != nil {
		t.Fatal(err)
	}
	d = start(t, nil, args...)
	d.waitReclaimed(time.Minute)
	// The reconciler's first pass follows the reclaim, and the quarantined
	// slot is in reach of it: a pass once tore the kept slot down, after
	// this test had looked.
	waitReconcilePass(t, d, "a reconcile pass")
	checkMovedAside(t, d, state)
	_, body, _ := d.get("/health")
	if !strings.Contains(body, `"status":"warn"`) || !strings.Contains(body, "state-lost") {
		t.Errorf("/health does not warn that the records were lost: %s", body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	got, err := d.slots().Get(ctx, &phasegatev1.GetRequest{Index: busy.slot.GetIndex()})
	if err != nil || got.GetSlot().GetState() != phasegatev1.SlotState_SLOT_STATE_QUARANTINED {
		t.Errorf("the inhabited slot: %v %v, want it quarantined", got, err)
	}
	if _, err := os.Stat(busy.slot.GetNetnsPath()); err != nil {
		t.Errorf("the inhabited slot's namespace was destroyed: %v", err)
	}
	if _, err := os.Stat(idle.slot.GetNetnsPath()); err == nil {
		if got, _ := d.slots().Get(ctx, &phasegatev1.GetRequest{Index: idle.slot.GetIndex()}); got.GetSlot().GetState() == phasegatev1.SlotState_SLOT_STATE_ACQUIRED {
			t.Errorf("a slot nothing lives in is leased without a record")
		}
	}
	// A second start with the unusable file still kept aside: safe mode
	// again, and the inhabited slot, which still has no record, is kept
	// again instead of being taken for leaked.
	d.signal(syscall.SIGTERM)
	if code := d.wait(time.Minute); code != 0 {
		t.Fatalf("exit %d", code)
	}
	d = start(t, nil, args...)
	d.waitReclaimed(time.Minute)
	waitReconcilePass(t, d, "a reconcile pass after the second start")
	if _, err := os.Stat(busy.slot.GetNetnsPath()); err != nil {
		t.Errorf("after a second start, the inhabited slot's namespace was destroyed: %v", err)
	}
	if _, body, _ := d.get("/health"); !strings.Contains(body, "kept aside") {
		t.Errorf("/health after a second start does not say the unusable file is kept aside: %s", body)
	}
	ok, failed, last := w.finish()
	if failed != 0 || ok == 0 {
		t.Errorf("the workload lost its network: %d probes failed (last %v), %d answered", failed, last, ok)
	}
	d.signal(syscall.SIGTERM)
	if code := d.wait(time.Minute); code != 0 {
		t.Fatalf("exit %d", code)
	}
	h.decommission(h.prefix)
	h.assertClean(h.prefix, nil)
}

// waitReconcilePass waits up to a minute for d's reconciler to end a
// pass, ok or failed.
func waitReconcilePass(t *testing.T, d *daemon, what string) {
	t.Helper()
	waitFor(t, time.Minute, what, func() bool {
		fams := scrapeMetrics(t, d)
		ok := metricValue(fams, "phasegate_reconcile_passes_total", "result", "ok")
		failed := metricValue(fams, "phasegate_reconcile_passes_total", "result", "failed")
		return ok > 0 || failed > 0
	})
}

// checkMovedAside checks the unusable state file was moved aside, once,
// said in one log line.
func checkMovedAside(t *testing.T, d *daemon, state string) {
	t.Helper()
	logs := d.Output()
	if n := strings.Count(logs, "state file unusable: moved aside"); n != 1 {
		t.Errorf("%d log lines about the unusable state file, want 1:\n%s", n, grepLines(logs, "state file"))
	}
	aside := leases.KeptAside(state).Copies
	if len(aside) != 1 {
		t.Fatalf("the unusable file was not kept aside: %v", aside)
	}
	if b, err := os.ReadFile(aside[0]); err != nil || !strings.HasPrefix(string(b), "not a database") {
		t.Errorf("the file kept aside is not the unusable one: %v", err)
	}
}

// A state file of a newer schema: the daemon refuses to start, exit 2, and
// says so in its last line; the file is left as it was.
func TestNewerStateSchemaRefusesToStart(t *testing.T) {
	h := newHost(t)
	if err := os.MkdirAll(h.stateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(h.stateDir, phases.StateFileName)
	db, err := bolt.Open(state, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		for _, b := range []string{"slots", "requests"} {
			if _, err := tx.CreateBucket([]byte(b)); err != nil {
				return err
			}
		}
		meta, err := tx.CreateBucket([]byte("meta"))
		if err != nil {
			return err
		}
		return meta.Put([]byte("schema"), []byte("99"))
	}); err != nil {
		t.Fatal(err)
	}
	db.Close()
	before, _ := os.ReadFile(state)

	d := start(t, nil, h.args(freePort(t), "--slots=64")...)
	if code := d.wait(time.Minute); code != 2 {
		t.Fatalf("exit %d, want 2:\n%s", code, d.Output())
	}
	last := lines(d.Output())
	if l := last[len(last)-1]; !strings.HasPrefix(l, "phasegate serve:") || !strings.Contains(l, "schema version 99") {
		t.Errorf("last line %q, want one saying the schema is newer", l)
	}
	if after, _ := os.ReadFile(state); string(after) != string(before) {
		t.Error("the newer file was changed")
	}
}

// Two daemons never share a state file, even when they manage different
// slots.
func TestTwoDaemonsNeverShareAStateFile(t *testing.T) {
	h := newHost(t)
	first := start(t, nil, h.args(freePort(t), "--slots=64")...)
	first.waitServing(time.Minute)

	h2 := newHost(t)
	args := h2.args(freePort(t), "--slots=64", "--state-dir="+h.stateDir)
	// The first daemon's control socket, in the state directory, is the
	// first thing in the way: refused before anything is made, exit 2.
	second := start(t, nil, args...)
	if code := second.wait(time.Minute); code != 2 {
		t.Fatalf("second daemon on the same state directory: exit %d, want 2", code)
	}
	if l := second.Output(); !strings.Contains(l, first.control) || !strings.Contains(l, "a live process answers on it") {
		t.Errorf("second daemon does not say the control socket %s is live:\n%s", first.control, l)
	}
	// With a control socket of its own, it gets as far as the state file,
	// which is taken.
	second = start(t, nil, append(args, "--control-socket="+filepath.Join(t.TempDir(), "second.sock"))...)
	if code := second.wait(time.Minute); code != 1 {
		t.Fatalf("second daemon on the same state file: exit %d, want 1", code)
	}
	if l := second.Output(); !strings.Contains(l, "open in another process") {
		t.Errorf("second daemon does not say the state file is taken:\n%s", grepLines(l, "state file"))
	}
	if _, err := os.Lstat(second.control); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the refused daemon left its control socket %s: %v", second.control, err)
	}
	// The first daemon's socket still answers.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := first.slots().List(ctx, &phasegatev1.ListRequest{}); err != nil {
		t.Errorf("the first daemon's control socket after the refused starts: %v", err)
	}
	first.signal(syscall.SIGTERM)
	if code := first.wait(time.Minute); code != 0 {
		t.Fatalf("exit %d", code)
	}
}
