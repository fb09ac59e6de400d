package lockfile_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/phases/lockfile"
)

// TestHelperHoldLock is not a test: run as a child process, it takes the lock
// and holds it until killed, like a second daemon would.
func TestHelperHoldLock(t *testing.T) {
	path := os.Getenv("LOCKFILE_HELPER_PATH")
	if path == "" {
		t.Skip("helper process only")
	}
	if os.Getenv("LOCKFILE_HELPER_SILENT") != "" {
		// A holder caught between its flock and writing its pid: the
		// moment a racing second instance may look at the file.
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
		if err == nil {
			err = unix.Flock(int(f.Fd()), unix.LOCK_EX)
		}
		if err != nil {
			os.Stdout.WriteString("error: " + err.Error() + "\n")
			os.Exit(1)
		}
	} else if _, err := lockfile.Acquire(context.Background(), path, 0); err != nil {
		os.Stdout.WriteString("error: " + err.Error() + "\n")
		os.Exit(1)
	}
	os.Stdout.WriteString("locked\n")
	time.Sleep(time.Hour) // until killed; a bare select{} is a deadlock the runtime ends
}

// holdInChild starts a process that holds the lock and returns it once it
// does.
func holdInChild(t *testing.T, path string, env ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperHoldLock$")
	cmd.Env = append(append(os.Environ(), "LOCKFILE_HELPER_PATH="+path), env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	buf := make([]byte, 64)
	n, _ := out.Read(buf)
	if !strings.HasPrefix(string(buf[:n]), "locked") {
		t.Fatalf("child did not lock: %q", buf[:n])
	}
	return cmd
}

func TestSecondInstanceFailsNamingTheHolder(t *testing.T) {
	path := filepath.Join(t.TempDir(), "phasegate.lock")
	child := holdInChild(t, path)

	_, err := lockfile.Acquire(context.Background(), path, 0)
	var held *lockfile.HeldError
	if !errors.As(err, &held) || held.PID != child.Process.Pid {
		t.Fatalf("err = %v, want HeldError naming pid %d", err, child.Process.Pid)
	}
	if want := "locked by pid " + strconv.Itoa(child.Process.Pid); !strings.Contains(err.Error(), want) {
		t.Fatalf("err %q does not say %q", err, want)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("lock file mode %v (%v), want 0600", fi.Mode(), err)
	}
}

func TestWaitThenAcquireWhenTheHolderDies(t *testing.T) {
	path := filepath.Join(t.TempDir(), "phasegate.lock")
	child := holdInChild(t, path)
	go func() {
		time.Sleep(100 * time.Millisecond)
		_ = child.Process.Kill() // kill -9: the kernel drops the flock
	}()
	l, err := lockfile.Acquire(context.Background(), path, time.Minute)
	if err != nil {
		t.Fatalf("waiting for a killed holder: %v", err)
	}
	defer l.Unlock()
	b, _ := os.ReadFile(path)
	if strings.TrimSpace(string(b)) != strconv.Itoa(os.Getpid()) {
		t.Fatalf("lock file says %q, want our pid %d", b, os.Getpid())
	}
}

func TestWaitHonoursContextAndDeadline(t *testing.T) {
	path := filepath.Join(t.TempDir(), "phasegate.lock")
	holdInChild(t, path)

	var held *lockfile.HeldError
	if _, err := lockfile.Acquire(context.Background(), path, 150*time.Millisecond); !errors.As(err, &held) {
		t.Fatalf("after the wait: %v, want HeldError", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := lockfile.Acquire(ctx, path, time.Hour); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled wait: %v", err)
	}
}

func TestStaleFileNeverBlocks(t *testing.T) {
	path := filepath.Join(t.TempDir(), "phasegate.lock")
	if err := os.WriteFile(path, []byte("999999\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := lockfile.Acquire(context.Background(), path, 0)
	if err != nil {
		t.Fatalf("a stale pid file blocked the lock: %v", err)
	}
	if err := l.Unlock(); err != nil {
		t.Fatal(err)
	}
	if err := l.Unlock(); err != nil {
		t.Fatalf("second Unlock: %v", err)
	}
	l2, err := lockfile.Acquire(context.Background(), path, 0)
	if err != nil {
		t.Fatalf("relock after Unlock: %v", err)
	}
	_ = l2.Unlock()
}

func TestProbe(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "phasegate.lock")
	if held, _, err := lockfile.Probe(context.Background(), path); held || err != nil {
		t.Fatalf("missing file: held %v err %v", held, err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("Probe created the lock file")
	}
	child := holdInChild(t, path)
	held, pid, err := lockfile.Probe(context.Background(), path)
	if !held || pid != child.Process.Pid || err != nil {
		t.Fatalf("held %v pid %d err %v, want held by %d", held, pid, err, child.Process.Pid)
	}
	_ = child.Process.Kill()
	_ = child.Wait()
	if held, _, err := lockfile.Probe(context.Background(), path); held || err != nil {
		t.Fatalf("after the holder died: held %v err %v", held, err)
	}
}

// A holder that has its flock but has not written its pid yet is still
// named: the kernel's lock table says who holds it. Before, a racing second
// daemon printed "another phasegate (pid 0)".
func TestHolderNamedBeforeItWritesItsPID(t *testing.T) {
	path := filepath.Join(t.TempDir(), "phasegate.lock")
	child := holdInChild(t, path, "LOCKFILE_HELPER_SILENT=1")
	if b, _ := os.ReadFile(path); len(b) != 0 {
		t.Fatalf("the silent holder wrote %q", b)
	}
	_, err := lockfile.Acquire(context.Background(), path, 0)
	var held *lockfile.HeldError
	if !errors.As(err, &held) || held.PID != child.Process.Pid {
		t.Fatalf("err = %v, want HeldError naming pid %d", err, child.Process.Pid)
	}
	if held, pid, err := lockfile.Probe(context.Background(), path); !held || pid != child.Process.Pid || err != nil {
		t.Fatalf("Probe: held %v pid %d err %v, want pid %d", held, pid, err, child.Process.Pid)
	}
	if strings.Contains(err.Error(), "pid 0") {
		t.Fatalf("error says pid 0: %v", err)
	}
}

func TestUnknownHolderIsNeverPIDZero(t *testing.T) {
	err := &lockfile.HeldError{Path: "/run/lock/x.lock"}
	if strings.Contains(err.Error(), "pid 0") || !strings.Contains(err.Error(), "pid unknown") {
		t.Fatalf("%q", err.Error())
	}
	if got := err.Holder(); got != "a process whose pid is unknown" {
		t.Fatalf("Holder() = %q", got)
	}
}

func TestSlotsPath(t *testing.T) {
	base := t.TempDir()
	real := filepath.Join(base, "run", "netns")
	if err := os.MkdirAll(real, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(base, "run"), filepath.Join(base, "varrun")); err != nil {
		t.Fatal(err)
	}
	path := func(dir, prefix string) string {
		t.Helper()
		p, err := lockfile.SlotsPath("/run/lock/phasegate", dir, prefix)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	canonical := path(real, "pg-")
	if filepath.Dir(canonical) != "/run/lock/phasegate" {
		t.Fatalf("lock %s is not in the lock directory", canonical)
	}
	for _, tc := range []struct {
		name, dir, prefix string
		same              bool
	}{
		{"the same directory through a symlinked parent", filepath.Join(base, "varrun", "netns"), "pg-", true},
		{"the same directory with a trailing slash", real + "/", "pg-", true},
		{"another prefix", real, "pgx-", false},
		{"another directory", filepath.Join(base, "other"), "pg-", false},
		{"a directory that does not exist yet, under the symlink", filepath.Join(base, "varrun", "netns", "sub"), "pg-", false},
	} {
		if got := path(tc.dir, tc.prefix); (got == canonical) != tc.same {
			t.Errorf("%s: %s vs %s, want same=%v", tc.name, got, canonical, tc.same)
		}
	}
	if a, b := path(filepath.Join(base, "varrun", "netns", "sub"), "pg-"), path(filepath.Join(real, "sub"), "pg-"); a != b {
		t.Errorf("a missing directory resolves through its parent: %s vs %s", a, b)
	}
	long := path(filepath.Join(base, strings.Repeat("d", 250)), "pg-")
	if len(filepath.Base(long)) > 255 {
		t.Errorf("name %d bytes long", len(filepath.Base(long)))
	}
	if _, err := lockfile.SlotsPath("relative", real, "pg-"); err == nil {
		t.Error("a relative lock directory was accepted")
	}
}

// A lock handed over across an exec is adopted as it is: the same open file
// description still holds the flock, so nobody can take it in between.
func TestAdoptAHandedOverLock(t *testing.T) {
	path := filepath.Join(t.TempDir(), "phasegate.lock")
	l, err := lockfile.Acquire(context.Background(), path, 0)
	if err != nil {
		t.Fatal(err)
	}
	// What the new image gets: another *os.File on the same description.
	fd, err := unix.Dup(int(l.File().Fd()))
	if err != nil {
		t.Fatal(err)
	}
	adopted, at, err := lockfile.Adopt(os.NewFile(uintptr(fd), path), path)
	if err != nil || at != path {
		t.Fatalf("adopt: at %q, %v", at, err)
	}
	if held, _, err := lockfile.Probe(context.Background(), path); !held || err != nil {
		t.Fatalf("the adopted lock is not held: %v %v", held, err)
	}
	other := filepath.Join(t.TempDir(), "other.lock")
	if err := os.WriteFile(other, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	fd2, _ := unix.Dup(int(l.File().Fd()))
	if _, _, err := lockfile.Adopt(os.NewFile(uintptr(fd2), other), other); err == nil {
		t.Fatal("a descriptor of another file was adopted")
	}
	if err := l.Unlock(); err != nil { // the old image's copy goes
		t.Fatal(err)
	}
	if held, _, _ := lockfile.Probe(context.Background(), path); !held {
		t.Fatal("closing the old image's descriptor released the adopted lock")
	}
	if err := adopted.Unlock(); err != nil {
		t.Fatal(err)
	}
	if held, _, _ := lockfile.Probe(context.Background(), path); held {
		t.Fatal("still held after the adopted lock was released")
	}
}
