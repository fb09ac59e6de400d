package netns

import (
	"context"
	"os/exec"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The path for kernels before 6.11 (no PIDFD_GET_NET_NAMESPACE): /proc is
// read, and the pidfd confirms it spoke of the pinned process.
func TestKillInWithoutIoctl(t *testing.T) {
	if unix.Geteuid() != 0 {
		t.Skip("needs root")
	}
	dir := t.TempDir()
	t.Cleanup(func() {
		_ = Delete(context.Background(), dir, "k1")
		for unix.Unmount(dir, unix.MNT_DETACH) == nil {
		}
	})
	path, err := Create(t.Context(), dir, "k1")
	if err != nil {
		t.Fatal(err)
	}
	id, err := Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := exec.LookPath("nsenter"); err != nil {
		t.Skip("nsenter not installed")
	}
	outside := exec.Command("sleep", "600")
	inside := exec.Command("nsenter", "--net="+path, "sleep", "600")
	for _, c := range []*exec.Cmd{outside, inside} {
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Process.Kill(); _ = c.Wait() })
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if in, _ := procInNamespace(inside.Process.Pid, id); in && Comm(inside.Process.Pid) == "sleep" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("nsenter did not enter the namespace")
		}
	}
	if killed, err := killIn(outside.Process.Pid, id, false); err != nil || killed {
		t.Errorf("killIn(outside, no ioctl) = %v, %v; want false, nil", killed, err)
	}
	if killed, err := killIn(inside.Process.Pid, id, false); err != nil || !killed {
		t.Errorf("killIn(inside, no ioctl) = %v, %v; want true, nil", killed, err)
	}
	if err := inside.Wait(); err == nil {
		t.Errorf("the process inside exited cleanly: it was not killed")
	}
	if err := unix.Kill(outside.Process.Pid, 0); err != nil {
		t.Errorf("the process outside was signalled: %v", err)
	}
}
