package test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
	"github.com/phasegate/phasegate/network/leases"
	"github.com/phasegate/phasegate/phases"
)

// tenant is a lease a client was told of, with a workload in its slot.
type tenant struct {
	held
	w *workload
}

// leaseWorkloads leases n slots to owners "tenant-<k>" and runs a
// workload in each.
func leaseWorkloads(t *testing.T, c phasegatev1.SlotsClient, n int) []tenant {
	t.Helper()
	var out []tenant
	for k := range n {
		h := acquire(t, c, fmt.Sprint("tenant-", k), fmt.Sprint("req-", k), 0)
		inside, _, _ := strings.Cut(h.slot.GetInsideAddress(), "/")
		out = append(out, tenant{held: h, w: startWorkload(t, h.slot.GetIndex(), h.slot.GetNetnsPath(), inside)})
	}
	return out
}

// survives checks that the tenant's namespace is the one it was given, and
// that its workload's process lives in it.
func (tn tenant) survives(t *testing.T, when string) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(tn.slot.GetNetnsPath(), &st); err != nil || st.Ino != tn.netns {
		t.Errorf("%s: slot %d's namespace is inode %d (%v), the tenant was given %d", when, tn.slot.GetIndex(), st.Ino, err, tn.netns)
	}
	var ns unix.Stat_t
	if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/net", tn.w.pid), &ns); err != nil || ns.Ino != tn.netns || !pidAlive(tn.w.pid) {
		t.Errorf("%s: slot %d's workload (pid %d): %v, in namespace %d; want alive in %d", when, tn.slot.GetIndex(), tn.w.pid, err, ns.Ino, tn.netns)
	}
}

// pidAlive reports whether process pid runs (not a zombie).
func pidAlive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	_, rest, _ := strings.Cut(string(b), ") ")
	return rest != "" && rest[0] != 'Z' && rest[0] != 'X'
}

// heldList runs `phasegate held list` against d.
func heldList(t *testing.T, d *daemon) phases.HeldList {
	t.Helper()
	out, err := runBinary("held", "list", "--socket="+d.control)
	if err != nil {
		t.Fatalf("phasegate held list: %v\n%s", err, out)
	}
	var l phases.HeldList
	if err := json.Unmarshal([]byte(out), &l); err != nil {
		t.Fatalf("phasegate held list: %v\n%s", err, out)
	}
	return l
}

// healthOf returns d's /health body.
func healthOf(t *testing.T, d *daemon) string {
	t.Helper()
	_, body, err := d.get("/health")
	if err != nil {
		t.Fatalf("/health: %v", err)
	}
	return body
}

// warningOf returns the message of d's health warning name, "" if none.
func warningOf(t *testing.T, d *daemon, name string) string {
	t.Helper()
	var v struct {
		Checks map[string][]struct {
			Status string `json:"status"`
			Output string `json:"output"`
		} `json:"checks"`
	}
	body := healthOf(t, d)
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Fatalf("/health: %v\n%s", err, body)
	}
	for _, c := range v.Checks["warning:"+name] {
		if c.Status == "warn" {
			return c.Output
		}
	}
	return ""
}

// reconciled waits for a reconcile pass of d: the held slots are in its
// reach once the background reclaim is over.
func reconciled(t *testing.T, d *daemon) {
	t.Helper()
	waitFor(t, time.Minute, "a reconcile pass", func() bool {
		fams := scrapeMetrics(t, d)
		return metricValue(fams, "phasegate_reconcile_passes_total", "result", "ok")+
			metricValue(fams, "phasegate_reconcile_passes_total", "result", "failed") > 0
	})
}

// A state file removed, emptied to 0 bytes, or a state directory emptied,
// after a kill -9 or a clean stop, next to 6 leased slots with workloads:
// the next start destroys none of them. Their slots carry the stamp of
// the records they were made under, which are gone: every one is held
// (quarantined, named in health), its namespace and its process as they
// were, the workloads answering throughout; `phasegate held` lists them,
// adopts three back as leases of their owners (a retried Acquire finds
// them, a restart restores them) and releases the other three (cut off,
// not killed).
func TestStateLostNextToWorkloadsHoldsThem(t *testing.T) {
	for _, stop := range []string{"kill -9", "clean stop"} {
		for _, damage := range []string{"removed", "truncated", "emptied"} {
			t.Run(strings.ReplaceAll(stop, " ", "")+"/"+damage, func(t *testing.T) {
				h := newHost(t)
				args := h.args(freePort(t), "--slots=64")
				d := start(t, nil, args...)
				d.waitServing(time.Minute)
				tenants := leaseWorkloads(t, d.slots(), 6)
				if stop == "kill -9" {
					d.signal(syscall.SIGKILL)
					d.wait(30 * time.Second)
				} else {
					stopCleanly(t, d)
				}
				damageStateDir(t, damage, h.stateDir)

				d = start(t, nil, args...)
				d.waitReclaimed(time.Minute)
				if stop == "kill -9" && damage == "removed" {
					// Once is enough to show a pass leaves the held
					// slots alone; it takes up to a pass's interval.
					reconciled(t, d)
				}
				for _, tn := range tenants {
					tn.survives(t, "after the start")
				}
				checkEveryTenantHeld(t, d, tenants)

				// Three adopted back for their owners, three released.
				adopted, released := tenants[:3], tenants[3:]
				adoptHeld(t, d, adopted)
				releaseHeld(t, d, released)
				if l := heldList(t, d); len(l.Held) != 0 {
					t.Errorf("held after adopting and releasing every one: %+v", l.Held)
				}
				if w := warningOf(t, d, "held-slots"); w != "" {
					t.Errorf("the held-slots warning outlived the held slots: %q", w)
				}
				for _, tn := range adopted {
					ok, failed, last := tn.w.finish()
					if failed != 0 || ok == 0 {
						t.Errorf("workload in slot %d: %d probes failed (last %v), %d answered", tn.slot.GetIndex(), failed, last, ok)
					}
				}

				// A restart restores the adopted leases, holds nothing.
				stopCleanly(t, d)
				d = start(t, nil, args...)
				d.waitReclaimed(time.Minute)
				for _, tn := range adopted {
					tn.survives(t, "after a restart")
					got, err := d.slots().Get(context.Background(), &phasegatev1.GetRequest{Index: tn.slot.GetIndex()})
					if err != nil || got.GetSlot().GetState() != phasegatev1.SlotState_SLOT_STATE_ACQUIRED || got.GetSlot().GetOwner() != tn.owner {
						t.Errorf("adopted slot %d after a restart: %v %v, want ACQUIRED by %s", tn.slot.GetIndex(), got, err, tn.owner)
					}
				}
				if l := heldList(t, d); len(l.Held) != 0 {
					t.Errorf("held after a restart: %+v", l.Held)
				}
				stopCleanly(t, d)
				h.decommission(h.prefix)
			})
		}
	}
}

// stopCleanly sends SIGTERM and fails the test unless the daemon exits 0
// within a minute.
func stopCleanly(t *testing.T, d *daemon) {
	t.Helper()
	d.signal(syscall.SIGTERM)
	if code := d.wait(time.Minute); code != 0 {
		t.Fatalf("stop: exit %d", code)
	}
}

// damageStateDir loses the state in dir as damage says: the state file
// removed, truncated to 0 bytes, or the whole directory emptied.
func damageStateDir(t *testing.T, damage, dir string) {
	t.Helper()
	switch damage {
	case "removed":
		if err := os.Remove(filepath.Join(dir, phases.StateFileName)); err != nil {
			t.Fatal(err)
		}
	case "truncated":
		if err := os.Truncate(filepath.Join(dir, phases.StateFileName), 0); err != nil {
			t.Fatal(err)
		}
	case "emptied":
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				t.Fatal(err)
			}
		}
	default:
		t.Fatalf("no damage %q", damage)
	}
}

// checkEveryTenantHeld checks each tenant's slot is held (its namespace
// with its workload's pid inside, its host link), named in health's
// warning, and QUARANTINED in the Slots API, and that /health warns.
func checkEveryTenantHeld(t *testing.T, d *daemon, tenants []tenant) {
	t.Helper()
	l := heldList(t, d)
	warn := warningOf(t, d, "held-slots")
	byIndex := map[int]phases.HeldView{}
	for _, v := range l.Held {
		byIndex[v.Index] = v
	}
	for _, tn := range tenants {
		i := int(tn.slot.GetIndex())
		v, ok := byIndex[i]
		if !ok || v.Netns.Ino != tn.netns || !slices.Contains(v.PIDs, tn.w.pid) || !v.HostLink {
			t.Errorf("slot %d: held %+v (%v); want it held, its namespace %d with pid %d inside", i, v, ok, tn.netns, tn.w.pid)
		}
		if !regexp.MustCompile(`\b` + strconv.Itoa(i) + `\b`).MatchString(warn) {
			t.Errorf("health's held-slots warning does not name slot %d: %q", i, warn)
		}
		got, err := d.slots().Get(context.Background(), &phasegatev1.GetRequest{Index: uint32(i)})
		if err != nil || got.GetSlot().GetState() != phasegatev1.SlotState_SLOT_STATE_QUARANTINED {
			t.Errorf("slot %d: %v %v, want QUARANTINED", i, got.GetSlot().GetState(), err)
		}
	}
	if !strings.Contains(healthOf(t, d), `"status":"warn"`) {
		t.Errorf("/health does not warn: %s", healthOf(t, d))
	}
}

// adoptHeld adopts each tenant's held slot back for its owner with
// `phasegate held adopt` and checks the owner's retried Acquire finds it
// under the new lease id.
func adoptHeld(t *testing.T, d *daemon, tenants []tenant) {
	t.Helper()
	for _, tn := range tenants {
		out, err := runBinary("held", "adopt", strconv.Itoa(int(tn.slot.GetIndex())), "--owner="+tn.owner,
			"--request-id="+tn.requestID, "--socket="+d.control)
		if err != nil {
			t.Fatalf("held adopt: %v\n%s", err, out)
		}
		var a phases.AdoptAnswer
		if err := json.Unmarshal([]byte(out), &a); err != nil || a.LeaseID == "" {
			t.Fatalf("held adopt: %v\n%s", err, out)
		}
		// The owner's retried Acquire finds it; its lease id
		// renews it.
		again := acquire(t, d.slots(), tn.owner, tn.requestID, 0)
		if again.slot.GetIndex() != tn.slot.GetIndex() || again.leaseID != a.LeaseID || again.netns != tn.netns {
			t.Errorf("retried Acquire of %s/%s: slot %d lease %s, want slot %d lease %s", tn.owner, tn.requestID,
				again.slot.GetIndex(), again.leaseID, tn.slot.GetIndex(), a.LeaseID)
		}
	}
}

// releaseHeld releases each tenant's held slot with `phasegate held
// release` and checks its namespace file is gone and its process cut off,
// not killed.
func releaseHeld(t *testing.T, d *daemon, tenants []tenant) {
	t.Helper()
	for _, tn := range tenants {
		out, err := runBinary("held", "release", strconv.Itoa(int(tn.slot.GetIndex())), "--socket="+d.control)
		if err != nil {
			t.Fatalf("held release: %v\n%s", err, out)
		}
		if _, err := os.Stat(tn.slot.GetNetnsPath()); !os.IsNotExist(err) {
			t.Errorf("released slot %d: its netns file is still there (%v)", tn.slot.GetIndex(), err)
		}
		if !pidAlive(tn.w.pid) {
			t.Errorf("released slot %d: its process was killed; the daemon runs without --reclaim-kill-orphans", tn.slot.GetIndex())
		}
	}
}

// slotsNamed returns the indices of every "slots [...]" list in msg.
func slotsNamed(msg string) map[int]bool {
	out := map[int]bool{}
	for _, m := range regexp.MustCompile(`slots \[([0-9 ]*)\]`).FindAllStringSubmatch(msg, -1) {
		for _, f := range strings.Fields(m[1]) {
			if i, err := strconv.Atoi(f); err == nil {
				out[i] = true
			}
		}
	}
	return out
}

// A journal removed, emptied, or cut in half after a kill -9 during a
// burst of Acquires, its leases not yet written into the file: a detected
// loss, never a silent reclaim. The start is in safe mode, health warns;
// every lease a caller was told of is either restored to its owner or
// named (held, or reclaimed with nothing inside); the workloads leased in
// the burst keep their namespace and process, held if their record is gone.
func TestJournalLostAfterAKillNamesEveryLease(t *testing.T) {
	for _, damage := range []string{"removed", "emptied", "cut in half"} {
		t.Run(strings.ReplaceAll(damage, " ", "-"), func(t *testing.T) {
			h := newHost(t)
			state, err := os.MkdirTemp("/dev/shm", "phasegate-journal-state-")
			if err != nil {
				t.Skipf("no tmpfs for the state directory: %v", err)
			}
			t.Cleanup(func() { os.RemoveAll(state) })
			h.stateDir = state
			const warm = 32
			args := h.args(freePort(t), "--slots=2000", "--pool-size="+strconv.Itoa(warm), "--pool-min-ready=1", "--control-rate=0")
			d := start(t, nil, args...)
			d.waitServing(2 * time.Minute)
			c := d.slots()
			waitWarm(t, c, warm)
			book := &ledger{told: map[string]held{}, pending: map[string]string{}}
			var tenants []tenant
			jpath := filepath.Join(state, phases.StateFileName+leases.JournalSuffix)
			acquireBurst(t, c, book, 8, 0, func() {
				// Mid-burst, its writes never pausing long enough for a
				// checkpoint: workloads in slots leased now.
				tenants = leaseWorkloads(t, c, 3)
				time.Sleep(100 * time.Millisecond)
				d.signal(syscall.SIGKILL)
			})
			d.wait(10 * time.Second)
			for _, tn := range tenants {
				book.add(tn.held)
			}
			damageJournal(t, damage, jpath)

			d = start(t, nil, args...)
			d.waitReclaimed(2 * time.Minute)
			checkEveryLeaseRestoredOrNamed(t, d, damage, book, tenants)
			stopCleanly(t, d)
			h.decommission(h.prefix)
		})
	}
}

// damageJournal loses the journal at jpath, which must hold the burst's
// entries, as damage says: removed, emptied, or cut in half.
func damageJournal(t *testing.T, damage, jpath string) {
	t.Helper()
	st, err := os.Stat(jpath)
	if err != nil || st.Size() < 1000 {
		t.Fatalf("the journal after the kill: %v, %v; want the burst's entries in it", st, err)
	}
	switch damage {
	case "removed":
		err = os.Remove(jpath)
	case "emptied":
		err = os.Truncate(jpath, 0)
	case "cut in half":
		err = os.Truncate(jpath, st.Size()/2)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// checkEveryLeaseRestoredOrNamed checks the start after the journal's
// loss warns that the journal lost writes, that every lease in the book
// is restored to its owner or named lost (held, or in the warning), and
// that each tenant's workload survives in a slot restored or held.
func checkEveryLeaseRestoredOrNamed(t *testing.T, d *daemon, damage string, book *ledger, tenants []tenant) {
	t.Helper()
	if !strings.Contains(healthOf(t, d), `"status":"warn"`) {
		t.Errorf("/health does not warn after the journal's loss: %s", healthOf(t, d))
	}
	lost := warningOf(t, d, "state-lost")
	if !strings.Contains(lost, "journal") {
		t.Errorf("health's state-lost warning does not say the journal lost writes: %q", lost)
	}
	named := slotsNamed(lost)
	heldAt := map[int]phases.HeldView{}
	for _, v := range heldList(t, d).Held {
		heldAt[v.Index] = v
		named[v.Index] = true
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	list, err := d.slots().List(ctx, &phasegatev1.ListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	listed := map[uint32]*phasegatev1.Slot{}
	for _, s := range list.GetSlots() {
		listed[s.GetIndex()] = s
	}
	restored, namedLost := 0, 0
	for _, b := range book.all() {
		i := b.slot.GetIndex()
		switch s := listed[i]; {
		case s.GetState() == phasegatev1.SlotState_SLOT_STATE_ACQUIRED && s.GetOwner() == b.owner:
			restored++
		case named[int(i)]:
			namedLost++
		default:
			t.Errorf("lease of %s (request %s) at slot %d: neither restored nor named lost (listed %v)", b.owner, b.requestID, i, s)
		}
	}
	for _, tn := range tenants {
		tn.survives(t, "after the start")
		i := int(tn.slot.GetIndex())
		if s := listed[uint32(i)]; s.GetState() != phasegatev1.SlotState_SLOT_STATE_ACQUIRED || s.GetOwner() != tn.owner {
			if v, ok := heldAt[i]; !ok || v.Netns.Ino != tn.netns {
				t.Errorf("slot %d with a workload: neither restored (%v) nor held (%+v)", i, s, v)
			}
		}
	}
	t.Logf("%s: %d leases told; %d restored, %d named lost; %d held", damage, len(book.all()), restored, namedLost, len(heldAt))
	if namedLost == 0 && damage != "cut in half" {
		t.Errorf("no lease named lost: the journal's loss went unseen")
	}
}

// A first start on a host full of leaked slots, with no state ever, tells
// the leaks (made by something that kept no records: no stamp) from slots
// made under records that are gone: the leaks are reclaimed, at the
// kernel's rate, processes inside them cut off; a slot another daemon's
// records vouched for, something living in it, is held.
func TestFirstStartTellsLeaksFromLostRecords(t *testing.T) {
	h := newHost(t)
	args := h.args(freePort(t), "--slots=400")
	// A daemon whose state directory is then lost: its slot, leased, with
	// a workload.
	d := start(t, nil, args...)
	d.waitServing(time.Minute)
	tenants := leaseWorkloads(t, d.slots(), 1)
	d.signal(syscall.SIGKILL)
	d.wait(30 * time.Second)
	if err := os.RemoveAll(h.stateDir); err != nil {
		t.Fatal(err)
	}
	// Leaks made by something else, one with a process inside.
	const leaks = 300
	if got := h.leak(h.prefix, 50, leaks); got != leaks {
		t.Fatalf("leaked %d, want %d", got, leaks)
	}
	orphan, _ := occupy(t, filepath.Join(h.netnsDir, h.prefix+"60"), filepath.Join(h.netnsDir, h.prefix+"61"))

	d = start(t, nil, args...)
	d.waitReclaimed(2 * time.Minute)
	reconciled(t, d)
	tenants[0].survives(t, "after the first start")
	l := heldList(t, d)
	if len(l.Held) != 1 || l.Held[0].Index != int(tenants[0].slot.GetIndex()) {
		t.Errorf("held %+v; want the lost records' slot %d alone", l.Held, tenants[0].slot.GetIndex())
	}
	for i := 50; i < 50+leaks; i++ {
		if _, err := os.Stat(filepath.Join(h.netnsDir, fmt.Sprint(h.prefix, i))); !os.IsNotExist(err) {
			t.Errorf("leak %d not reclaimed: %v", i, err)
			break
		}
	}
	if !alive(orphan) {
		t.Errorf("the process in a leak was killed")
	}
	t.Logf("%s", grepLines(d.Output(), "reclaim report"))
	d.signal(syscall.SIGTERM)
	if code := d.wait(time.Minute); code != 0 {
		t.Fatalf("stop: exit %d", code)
	}
	h.decommission(h.prefix)
}

// A leased slot's host link deleted while the daemon was down: the next
// start's verification makes it again into the slot's namespace, intact,
// rather than tear the namespace down: the lease is ACQUIRED, its
// namespace and process as they were, its workload answering again.
func TestHostLinkDeletedIsMadeAgainAtTheRestart(t *testing.T) {
	h := newHost(t)
	args := h.args(freePort(t), "--slots=64")
	d := start(t, nil, args...)
	d.waitServing(time.Minute)
	tenants := leaseWorkloads(t, d.slots(), 2)
	d.signal(syscall.SIGTERM)
	if code := d.wait(time.Minute); code != 0 {
		t.Fatalf("stop: exit %d", code)
	}
	broken := tenants[0]
	run(t, "ip", "link", "del", broken.slot.GetHostInterface())
	d = start(t, nil, args...)
	d.waitReclaimed(time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, tn := range tenants {
		tn.survives(t, "after the restart")
		got, err := d.slots().Get(ctx, &phasegatev1.GetRequest{Index: tn.slot.GetIndex()})
		if err != nil || got.GetSlot().GetState() != phasegatev1.SlotState_SLOT_STATE_ACQUIRED || got.GetSlot().GetOwner() != tn.owner {
			t.Errorf("slot %d after the restart: %v %v, want ACQUIRED by %s", tn.slot.GetIndex(), got, err, tn.owner)
		}
	}
	if !strings.Contains(d.Output(), "host link made again") {
		t.Errorf("the start does not say it made the host link again:\n%s", grepLines(d.Output(), "restored lease"))
	}
	inside, _, _ := strings.Cut(broken.slot.GetInsideAddress(), "/")
	w := probeEcho(broken.slot.GetIndex(), inside+":"+workloadPort)
	waitFor(t, 30*time.Second, "the workload behind the new host link to answer", func() bool { return w.ok.Load() > 0 })
	w.finish()
	// A second restart finds the new host link the one recorded.
	d.signal(syscall.SIGTERM)
	if code := d.wait(time.Minute); code != 0 {
		t.Fatalf("stop: exit %d", code)
	}
	d = start(t, nil, args...)
	d.waitReclaimed(time.Minute)
	broken.survives(t, "after a second restart")
	got, err := d.slots().Get(ctx, &phasegatev1.GetRequest{Index: broken.slot.GetIndex()})
	if err != nil || got.GetSlot().GetState() != phasegatev1.SlotState_SLOT_STATE_ACQUIRED {
		t.Errorf("slot %d after a second restart: %v %v, want ACQUIRED", broken.slot.GetIndex(), got, err)
	}
	d.signal(syscall.SIGTERM)
	if code := d.wait(time.Minute); code != 0 {
		t.Fatalf("stop: exit %d", code)
	}
	h.decommission(h.prefix)
}
