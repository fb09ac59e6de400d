package slot

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/network/netns"
)

// testManager is a playground of this package's own (nettest imports slot,
// so internal tests cannot use it): a random prefix, a temporary directory,
// and a clean-up of slots 1..8 and the table.
func testManager(t *testing.T) *Manager {
	t.Helper()
	return testManagerWith(t, func(*Config) {})
}

// testManagerWith is testManager with its configuration changed by mod.
func testManagerWith(t *testing.T, mod func(*Config)) *Manager {
	t.Helper()
	if unix.Geteuid() != 0 {
		t.Skip("needs root")
	}
	b := []byte("pi")
	for range 4 {
		b = append(b, byte('a'+rand.IntN(26)))
	}
	cfg := DefaultConfig()
	cfg.Prefix = string(b)
	cfg.NetnsDir = t.TempDir()
	cfg.Slots = 8
	mod(&cfg)
	m, err := NewManager(context.Background(), cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		for i := 1; i <= cfg.Slots; i++ {
			if err := m.Destroy(ctx, i); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		}
		if err := m.fw.Delete(ctx); err != nil {
			t.Errorf("cleanup: %v", err)
		}
		for unix.Unmount(cfg.NetnsDir, unix.MNT_DETACH) == nil {
		}
	})
	return m
}

// An entry that cannot be inspected is reported, its index left out of the
// inventory (its link and element are not torn down) and quarantined; Scan
// refuses to give an inventory that silently lacks it. Before, the entry
// was neither reclaimed nor reported.
func TestSurveyReportsUnreadable(t *testing.T) {
	m := testManager(t)
	ctx := context.Background()
	for _, i := range []int{2, 3} {
		if _, err := m.Create(ctx, i); err != nil {
			t.Fatal(err)
		}
	}
	eio := fmt.Errorf("fstatat %s: %w", m.cfg.NetnsPath(3), unix.EIO)
	failing := func(dir string, match func(string) bool) ([]netns.Found, error) {
		found, err := netns.Survey(dir, match)
		for k := range found {
			if found[k].Name == m.cfg.NetnsName(3) {
				found[k].State, found[k].Err = netns.Missing, eio
			}
		}
		return found, err
	}
	sr, err := survey(ctx, m.cfg, m.fw, failing)
	if err != nil {
		t.Fatal(err)
	}
	if len(sr.Unreadable) != 1 || sr.Unreadable[0].Index != 3 || !errors.Is(sr.Unreadable[0].Err, unix.EIO) {
		t.Errorf("Unreadable = %+v", sr.Unreadable)
	}
	if _, ok := sr.Inventory[3]; ok || sr.Inventory[2] != All {
		t.Errorf("Inventory = %v, want slot 2 only", sr.Inventory)
	}
	if q := sr.Quarantine(m.cfg.Slots); !slices.Equal(q, []int{3}) {
		t.Errorf("Quarantine = %v", q)
	}
	var ue *UnreadableError
	if _, err := scanOnly(sr, nil); !errors.As(err, &ue) || !errors.Is(err, unix.EIO) {
		t.Errorf("Scan with an unreadable entry = %v, want *UnreadableError", err)
	}
}

// When /proc cannot be read, the teardown says so and treats every
// namespace as possibly held: a namespace that a process keeps alive is cut
// off after the wait, and nothing is killed. Before, the error was dropped.
func TestTeardownReportsProcScanError(t *testing.T) {
	m := testManager(t)
	ctx := context.Background()
	s, err := m.Create(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := exec.LookPath("nsenter"); err != nil {
		t.Skip("nsenter not installed")
	}
	inside := exec.Command("nsenter", "--net="+s.NetnsPath, "sleep", "600")
	if err := inside.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = inside.Process.Kill(); _ = inside.Wait() })
	id, err := netns.Stat(s.NetnsPath)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		var st unix.Stat_t
		if unix.Stat(fmt.Sprintf("/proc/%d/ns/net", inside.Process.Pid), &st) == nil && st.Ino == id.Ino && netns.Comm(inside.Process.Pid) == "sleep" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("nsenter did not enter the namespace")
		}
	}
	scanErr := errors.New("open /proc: too many open files")
	res := m.Teardown(ctx, Assume(1), TeardownOptions{
		KillOrphans: true, HostGoneTimeout: 300 * time.Millisecond,
		scanProcs: func() (netns.Processes, netns.Processes, error) { return nil, nil, scanErr },
	})
	if !errors.Is(res.ProcScan, scanErr) {
		t.Errorf("ProcScan = %v, want the scan's error", res.ProcScan)
	}
	if !slices.Equal(res.Reclaimed, []int{1}) || !slices.Equal(res.CutOff, []int{1}) || len(res.Orphans) != 0 {
		t.Errorf("result %v, cut off %v, orphans %+v; want slot 1 reclaimed and cut off, no orphan", res, res.CutOff, res.Orphans)
	}
	if err := unix.Kill(inside.Process.Pid, 0); err != nil {
		t.Errorf("a process was killed without a scan that found it")
	}
	if els, _ := m.fw.List(ctx); slices.Contains(els, s.HostIf) {
		t.Errorf("element left")
	}
}

// niceThread lowers the priority of the calling goroutine's thread only,
// never raises one already lower, and the thread goes with the goroutine:
// the rest of the process keeps its priority.
func TestNiceThread(t *testing.T) {
	niceOf := func(tid int) int {
		t.Helper()
		p, err := unix.Getpriority(unix.PRIO_PROCESS, tid)
		if err != nil {
			t.Fatalf("getpriority(%d): %v", tid, err)
		}
		return 20 - p
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	own := niceOf(unix.Gettid())
	tests := []struct {
		name       string
		before     int // the thread's nice before niceThread
		nice, want int
	}{
		{"lowered", own, own + 10, own + 10},
		{"already lower: kept", own + 15, own + 5, own + 15},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := make(chan int, 1)
			tids := make(chan int, 1)
			go func() {
				runtime.LockOSThread() // niceThread's lock is the same: this thread ends with the goroutine
				if err := unix.Setpriority(unix.PRIO_PROCESS, unix.Gettid(), tt.before); err != nil {
					t.Errorf("setpriority: %v", err)
				}
				niceThread(tt.nice)
				tids <- unix.Gettid()
				got <- niceOf(unix.Gettid())
			}()
			if g := <-got; g != tt.want {
				t.Errorf("nice %d on a thread at %d: %d, want %d", tt.nice, tt.before, g, tt.want)
			}
			tid := <-tids
			if n := niceOf(unix.Gettid()); n != own {
				t.Errorf("the test's own thread went from nice %d to %d", own, n)
			}
			// The goroutine ended locked: its thread exits with it.
			deadline := time.Now().Add(time.Minute)
			for {
				if _, err := os.Stat(fmt.Sprintf("/proc/self/task/%d", tid)); os.IsNotExist(err) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("thread %d at nice %d still there a minute after its goroutine ended", tid, tt.want)
				}
				time.Sleep(time.Millisecond)
			}
		})
	}
}
