package test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/network/leases"
	"github.com/phasegate/phasegate/phases"
)

// `phasegate reclaim`, run by an operator on a host whose daemon is
// stopped, over records of every kind: a lease whose slot is intact (a
// start would verify it; a workload lives in it), a lease whose namespace
// is gone (lost), a lease whose record cannot be read, the warm slots kept
// idle, and slots no record accounts for (leaked). Only the leaked ones
// and what is left at the lost lease's index are torn down; the records
// stay as they were. Then, with the whole state file unusable, a second
// reclaim runs in safe mode: it keeps the slot a workload lives in and
// takes the rest.
func TestReclaimCommandOverEveryKindOfRecord(t *testing.T) {
	h := newHost(t)
	addr := freePort(t)
	d := start(t, nil, h.args(addr, "--slots=64")...)
	d.waitServing(time.Minute)
	c := d.slots()
	intact := acquire(t, c, "reclaim-intact", "r1", 0)
	gone := acquire(t, c, "reclaim-gone", "r2", 0)
	unreadable := acquire(t, c, "reclaim-unreadable", "r3", 0)
	inside, _, _ := strings.Cut(intact.slot.GetInsideAddress(), "/")
	w := startWorkload(t, intact.slot.GetIndex(), intact.slot.GetNetnsPath(), inside)
	d.signal(syscall.SIGTERM)
	if code := d.wait(time.Minute); code != 0 {
		t.Fatalf("exit %d", code)
	}
	idle := idleRecorded(t, h)

	// The lost lease: its namespace unmounted and removed behind the
	// records' back.
	if err := unix.Unmount(gone.slot.GetNetnsPath(), unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(gone.slot.GetNetnsPath()); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(h.stateDir, phases.StateFileName)
	spoilOwner(t, state, "reclaim-unreadable")
	leaked := h.leak(h.prefix, 50, 10)

	args := []string{"reclaim", "--netns-dir=" + h.netnsDir, "--slot-prefix=" + h.prefix, "--slots=64", "--state-dir=" + h.stateDir}
	out, code := cli(t, args...)
	want := fmt.Sprintf("1 leased and %d idle slots recorded, left as they are; 1 leases lost; 0 unknown slots with processes kept; 1 unreadable records, their slots kept ([%d])",
		len(idle), unreadable.slot.GetIndex())
	if code != 0 || !strings.Contains(out, want) {
		t.Fatalf("reclaim: exit %d, want 0 and %q:\n%s", code, want, out)
	}
	for i := 50; i < 50+leaked; i++ {
		if _, err := os.Lstat(fmt.Sprintf("%s/%s%d", h.netnsDir, h.prefix, i)); err == nil {
			t.Errorf("leaked slot %d is still there", i)
		}
	}
	if l := h.links(fmt.Sprintf("%sh%d", h.prefix, gone.slot.GetIndex())); len(l) > 0 {
		t.Errorf("the lost lease's host link is left: %v", l)
	}
	sameNetns(t, "the intact lease's", intact.slot.GetNetnsPath(), intact.netns)
	sameNetns(t, "the unreadable record's", unreadable.slot.GetNetnsPath(), unreadable.netns)
	for _, p := range idle {
		if _, err := os.Lstat(p); err != nil {
			t.Errorf("idle slot %s: %v", p, err)
		}
	}
	checkRecordsKept(t, state, unreadable, []held{intact, gone})

	// The whole file unusable: safe mode keeps what something lives in.
	if err := os.WriteFile(state, bytes.Repeat([]byte("not a database\n"), 1000), 0o600); err != nil {
		t.Fatal(err)
	}
	out, code = cli(t, args...)
	if code != 0 || !strings.Contains(out, "0 leased and 0 idle slots recorded, left as they are; 0 leases lost; 1 unknown slots with processes kept") ||
		!strings.Contains(out, "safe mode: state file unusable") {
		t.Fatalf("reclaim over an unusable state file: exit %d\n%s", code, out)
	}
	sameNetns(t, "in safe mode, the inhabited slot's", intact.slot.GetNetnsPath(), intact.netns)
	for _, p := range append(idle, unreadable.slot.GetNetnsPath()) {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("in safe mode, slot %s, which nothing lives in, was kept", p)
		}
	}
	if aside := leases.KeptAside(state).Copies; len(aside) != 1 {
		t.Errorf("the unusable file was not kept aside: %v", aside)
	}
	ok, failed, last := w.finish()
	if failed != 0 || ok == 0 {
		t.Errorf("the workload lost its network: %d probes failed (last %v), %d answered", failed, last, ok)
	}
	h.decommission(h.prefix)
	h.assertClean(h.prefix, nil)
}

// idleRecorded is the namespace paths of the warm slots the stopped
// daemon recorded idle (there must be some), after checking only its
// prefix's slots are recorded.
func idleRecorded(t *testing.T, h *host) []string {
	t.Helper()
	recorded := h.assertOnlyRecorded(h.prefix)
	var idle []string
	for _, r := range recorded {
		if r.State == leases.Idle {
			idle = append(idle, fmt.Sprintf("%s/%s%d", h.netnsDir, h.prefix, r.Index))
		}
	}
	if len(idle) == 0 {
		t.Fatal("the stop kept no warm slot: the test needs idle records")
	}
	return idle
}

// checkRecordsKept checks the records after a reclaim are as they were:
// the unreadable one alone unreadable, and each of kept's leases recorded
// for its owner under its lease id.
func checkRecordsKept(t *testing.T, state string, unreadable held, kept []held) {
	t.Helper()
	recs, bad := loadState(t, state)
	if _, ok := bad[int(unreadable.slot.GetIndex())]; !ok || len(bad) != 1 {
		t.Errorf("unreadable records after the reclaim: %v, want slot %d's alone", bad, unreadable.slot.GetIndex())
	}
	for _, l := range kept {
		r, ok := recs[int(l.slot.GetIndex())]
		if !ok || r.State != leases.Leased || r.Owner != l.owner || r.LeaseID != l.leaseID {
			t.Errorf("slot %d's record after the reclaim: %+v, want %s's lease as it was", l.slot.GetIndex(), r, l.owner)
		}
	}
}

// spoilOwner makes the record whose owner is owner unreadable, in place:
// field number 0 is invalid protobuf. The owner must appear once as a
// record's field (tag 0x12, then its length).
func spoilOwner(t *testing.T, path, owner string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// Every copy: the live record, and those a commit left in pages it
	// freed (a small bucket lives inline in its parent's page, which
	// every commit of meta rewrites).
	field := append([]byte{0x12, byte(len(owner))}, owner...)
	if n := bytes.Count(b, field); n == 0 {
		t.Fatalf("%s's owner field not found in %s (records still in the journal?)", owner, path)
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for off := 0; ; {
		i := bytes.Index(b[off:], field)
		if i < 0 {
			break
		}
		if _, err := f.WriteAt([]byte{0x00}, int64(off+i)); err != nil {
			t.Fatal(err)
		}
		off += i + len(field)
	}
}

// loadState reads the records at path: the readable ones by index, and
// the indices of the unreadable ones.
func loadState(t *testing.T, path string) (map[int]leases.Record, map[int]error) {
	t.Helper()
	st, err := leases.Open(path, leases.Options{})
	if err != nil {
		t.Fatalf("open the records: %v", err)
	}
	defer st.Close()
	list, err := st.Load()
	var re *leases.RecordsError
	if err != nil && !errors.As(err, &re) {
		t.Fatalf("load the records: %v", err)
	}
	recs := map[int]leases.Record{}
	for _, r := range list {
		recs[r.Index] = r
	}
	bad := map[int]error{}
	if re != nil {
		for i, e := range re.Bad {
			bad[i] = e
		}
	}
	return recs, bad
}

// sameNetns fails unless the namespace file at path is still inode ino.
func sameNetns(t *testing.T, what, path string, ino uint64) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil || st.Ino != ino {
		t.Errorf("%s namespace %s is inode %d (%v), was %d", what, path, st.Ino, err, ino)
	}
}
