package test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
)

// occupy starts a process that lives inside the namespace at path, and one
// that only holds the file open, as a sandbox and a stray tool would.
func occupy(t *testing.T, inside, heldOpen string) (insideProc, holder *exec.Cmd) {
	t.Helper()
	insideProc = exec.Command("nsenter", "--net="+inside, "sleep", "600")
	holder = exec.Command("bash", "-c", `exec 3<"$1"; exec sleep 600`, "hold", heldOpen)
	for _, c := range []*exec.Cmd{insideProc, holder} {
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Process.Kill(); _ = c.Wait() })
	}
	// Wait until both really are in place.
	waitFor(t, 10*time.Second, "the processes to occupy the namespaces", func() bool {
		out, _ := exec.Command("ls", "-l", "/proc/"+strconv.Itoa(holder.Process.Pid)+"/fd").Output()
		inNS, _ := exec.Command("readlink", "/proc/"+strconv.Itoa(insideProc.Process.Pid)+"/ns/net").Output()
		self, _ := exec.Command("readlink", "/proc/self/ns/net").Output()
		return strings.Contains(string(out), heldOpen) && len(inNS) > 0 && string(inNS) != string(self)
	})
	return insideProc, holder
}

// alive reports whether c's process runs: not gone, and not a zombie
// waiting to be reaped.
func alive(c *exec.Cmd) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(c.Process.Pid) + "/stat")
	if err != nil {
		return false
	}
	_, rest, _ := strings.Cut(string(b), ") ")
	return rest != "" && rest[0] != 'Z' && rest[0] != 'X'
}

func TestBusyNamespacesAtShutdown(t *testing.T) {
	h := newHost(t)
	addr := freePort(t)
	d := start(t, nil, h.args(addr, "--slots=64", "--stop-timeout=3s")...)
	d.waitServing(time.Minute)
	slots := d.slots()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var paths []string
	for _, owner := range []string{"sandbox-live", "sandbox-fd"} {
		resp, err := slots.Acquire(ctx, &phasegatev1.AcquireRequest{Owner: owner, RequestId: owner})
		if err != nil {
			t.Fatal(err)
		}
		paths = append(paths, resp.GetSlot().GetNetnsPath())
	}
	inside, holder := occupy(t, paths[0], paths[1])

	began := time.Now()
	d.signal(syscall.SIGTERM)
	if code := d.wait(time.Minute); code != 0 {
		t.Fatalf("exit %d with busy namespaces, want 0", code)
	}
	took := time.Since(began)
	t.Logf("drain with a process inside one slot and an fd on another took %v", took)
	// drain delay 200ms + stop timeout 3s is the budget; allow slack for
	// the race-detector build.
	if took > 15*time.Second {
		t.Errorf("drain took %v", took)
	}
	// A stop keeps leased slots as they are: the workloads live on.
	recs := h.assertOnlyRecorded(h.prefix)
	if !alive(inside) || !alive(holder) {
		t.Error("the daemon killed processes of its users at shutdown")
	}
	for _, p := range paths {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("a leased slot's namespace is gone after a stop: %v", err)
		}
	}
	// Decommissioning destroys the slots and cuts the processes off; it
	// does not kill them (they are the workloads', not ours).
	h.decommission(h.prefix)
	h.assertClean(h.prefix, nil)
	if !alive(inside) || !alive(holder) {
		t.Error("decommission killed processes of its users; it should only cut them off")
	}
	writeReport(t, "busy-shutdown.txt", fmt.Sprintf("drain with a live process in one leased slot and an open fd on another: exit 0 in %v; "+
		"the %d recorded slots kept and the processes untouched; decommission then removed everything and cut the processes off without killing them\n",
		took.Round(time.Millisecond), len(recs)))
}

func TestBusyNamespacesAtReclaim(t *testing.T) {
	for _, kill := range []bool{false, true} {
		name := "report-and-cut-off"
		if kill {
			name = "kill-orphans"
		}
		t.Run(name, func(t *testing.T) {
			h := newHost(t)
			// Indices above the pool's, so that a fresh slot does not reuse
			// the name of the one checked.
			h.leak(h.prefix, 11, 10)
			inside, holder := occupy(t, h.netnsDir+"/"+h.prefix+"13", h.netnsDir+"/"+h.prefix+"17")
			args := h.args(freePort(t), "--slots=64")
			if kill {
				args = append(args, "--reclaim-kill-orphans")
			}
			d := start(t, nil, args...)
			d.waitReclaimed(time.Minute)
			report := grepLines(d.Output(), "reclaim report")
			if !strings.Contains(report, "found=10") || !strings.Contains(report, "orphans=1") || !strings.Contains(report, "failed=0") {
				t.Errorf("reclaim report %q, want found=10 orphans=1 failed=0", report)
			}
			if l := h.links(h.prefix + "h13"); len(l) != 0 {
				t.Errorf("the orphan's host link was not cut: %v", l)
			}
			if kill == alive(inside) {
				t.Errorf("orphan alive=%v with kill-orphans=%v", alive(inside), kill)
			}
			if !alive(holder) {
				t.Error("a process that only held the file open was killed")
			}
			d.signal(syscall.SIGTERM)
			if code := d.wait(30 * time.Second); code != 0 {
				t.Fatalf("exit %d", code)
			}
			h.stoppedCleanly(h.prefix, nil)
			writeReport(t, "busy-reclaim-"+name+".txt", report+"\n")
		})
	}
}

// A release with a process still inside the slot's namespace says so in
// one line naming the slot, how many and their pids; the process is cut
// off and runs on, or, with --release-kill-orphans, is killed. On 65cb2fe
// the release logged nothing of it (and the reclaim's flag decided).
func TestProcessesLeftInAReleasedSlot(t *testing.T) {
	for _, kill := range []bool{false, true} {
		t.Run(fmt.Sprintf("kill=%v", kill), func(t *testing.T) {
			h := newHost(t)
			args := h.args(freePort(t), "--slots=64")
			if kill {
				args = append(args, "--release-kill-orphans")
			}
			d := start(t, nil, args...)
			d.waitServing(time.Minute)
			l := acquire(t, d.slots(), "sandbox-left", "left-1", 0)
			inside := exec.Command("nsenter", "--net="+l.slot.GetNetnsPath(), "sleep", "600")
			if err := inside.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = inside.Process.Kill(); _ = inside.Wait() })
			pid := strconv.Itoa(inside.Process.Pid)
			waitFor(t, 10*time.Second, "the process to enter the slot", func() bool {
				in, _ := os.Readlink("/proc/" + pid + "/ns/net")
				self, _ := os.Readlink("/proc/self/ns/net")
				return in != "" && in != self
			})
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if _, err := d.slots().Release(ctx, &phasegatev1.ReleaseRequest{Index: l.slot.GetIndex(), LeaseId: l.leaseID}); err != nil {
				t.Fatalf("Release: %v", err)
			}
			said := grepLines(d.Output(), "with processes still inside")
			if n := len(lines(said)); n != 1 || !strings.Contains(said, fmt.Sprintf("slot=%d processes=1", l.slot.GetIndex())) || !strings.Contains(said, pid+"(sleep)") {
				t.Errorf("the release said %d lines %q, want one naming slot %d, 1 process and pid %s", n, said, l.slot.GetIndex(), pid)
			}
			if kill != strings.Contains(said, "killed") {
				t.Errorf("the line %q, with --release-kill-orphans=%v", said, kill)
			}
			if kill {
				waitFor(t, 10*time.Second, "the process to be killed", func() bool { return !alive(inside) })
			} else if !alive(inside) {
				t.Error("the process was killed without --release-kill-orphans")
			}
			d.signal(syscall.SIGTERM)
			if code := d.wait(30 * time.Second); code != 0 {
				t.Fatalf("exit %d", code)
			}
			h.stoppedCleanly(h.prefix, nil)
		})
	}
}
