package netns_test

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/network/internal/nettest"
	"github.com/phasegate/phasegate/network/netns"
)

// startLeaver starts a process inside the namespace at path that, once a
// line is written to it, re-executes itself into the test's own network
// namespace (same pid) and sleeps there.
func startLeaver(t *testing.T, path string) (pid int, leave func()) {
	t.Helper()
	home := fmt.Sprintf("/proc/%d/ns/net", os.Getpid())
	if _, err := exec.LookPath("nsenter"); err != nil {
		t.Skip("nsenter not installed")
	}
	cmd := exec.Command("nsenter", "--net="+path, "sh", "-c", `read x; exec nsenter --net="$1" sleep 600`, "sh", home)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	id, err := netns.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	waitNS(t, cmd.Process.Pid, id, "sh")
	return cmd.Process.Pid, func() {
		if _, err := io.WriteString(in, "go\n"); err != nil {
			t.Fatal(err)
		}
		var st unix.Stat_t
		if err := unix.Stat(home, &st); err != nil {
			t.Fatal(err)
		}
		waitNS(t, cmd.Process.Pid, netns.ID{Dev: st.Dev, Ino: st.Ino}, "sleep")
	}
}

// waitNS waits until pid is in namespace id and runs comm.
func waitNS(t *testing.T, pid int, id netns.ID, comm string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		var st unix.Stat_t
		if unix.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &st) == nil && st.Dev == id.Dev && st.Ino == id.Ino &&
			netns.Comm(pid) == comm {
			return
		}
	}
	t.Fatalf("pid %d did not reach namespace %d running %s", pid, id.Ino, comm)
}

func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// A zombie (state Z) is dead: it waits to be reaped by its parent.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	return len(f) > 0 && f[0] != "Z"
}

// A process found in a namespace by a /proc scan that has left it by the
// time it is to be killed is not killed. Before pidfds, teardown sent
// SIGKILL to the scanned pid blindly (netns.Kill), which killed it.
func TestKillInSparesProcessThatLeft(t *testing.T) {
	dir, prefix := setup(t)
	path, err := netns.Create(t.Context(), dir, prefix+"1")
	if err != nil {
		t.Fatal(err)
	}
	id, err := netns.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	pid, leave := startLeaver(t, path)
	procs, err := scanProcesses(t)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, p := range procs[id] {
		found = found || p == pid
	}
	if !found {
		t.Fatalf("scan did not find pid %d inside", pid)
	}
	leave() // the scan is now stale
	killed, err := netns.KillIn(pid, id)
	if err != nil || killed {
		t.Errorf("KillIn(process that left) = %v, %v; want false, nil", killed, err)
	}
	if !alive(pid) {
		t.Errorf("the process that left the namespace was killed")
	}

	// One still inside is killed.
	inside := nettest.StartInside(t, path)
	killed, err = netns.KillIn(inside.Process.Pid, id)
	if err != nil || !killed {
		t.Errorf("KillIn(process inside) = %v, %v; want true, nil", killed, err)
	}
	_ = inside.Wait()

	// A pid that no longer exists.
	if killed, err := netns.KillIn(inside.Process.Pid, id); err != nil || killed {
		t.Errorf("KillIn(reaped pid) = %v, %v; want false, nil", killed, err)
	}
}
