package netns

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

const nobody = 65534

// heldIn starts `cat` as uid nobody in a user namespace of its own (which
// nobody owns, mapping its root to nobody) and a network namespace made
// in it, with more unshare flags in args; it ends when the test does.
func heldIn(t testing.TB, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("unshare", append(append([]string{"--user", "--map-root-user"}, args...), "cat")...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.Close(); _ = cmd.Wait() })
	waitExec(t, cmd.Process.Pid)
	return cmd
}

// waitExec waits until process pid runs cat: unshare execs it once the
// namespaces are made.
func waitExec(t testing.TB, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if exe, _ := os.Readlink("/proc/" + strconv.Itoa(pid) + "/exe"); filepath.Base(exe) == "cat" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d does not run cat after 10 s", pid)
		}
		time.Sleep(time.Millisecond)
	}
}

func openNS(t *testing.T, path string) int {
	t.Helper()
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

func credsOf(t *testing.T, pid int) Creds {
	t.Helper()
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(pidfd)
	c, err := ReadCreds(pidfd, pid)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// The kernel's rule, against namespaces the kernel made: a user
// namespace's owner may enter what it owns (and what is nested below);
// a process inside holds what its capabilities there give; nobody else,
// and nothing above, may.
func TestMayEnter(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	owned := heldIn(t, "--net")
	nested := heldIn(t, "--net")
	inner := exec.Command("nsenter", "--preserve-credentials", "-t", strconv.Itoa(nested.Process.Pid), "-U", "-n", "--", "unshare", "--user", "--map-root-user", "--net", "cat")
	inner.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	innerIn, err := inner.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := inner.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { innerIn.Close(); _ = inner.Wait() })
	waitExec(t, inner.Process.Pid)

	host := credsOf(t, os.Getpid())
	if host.EUID != 0 || !host.SysAdmin {
		t.Fatalf("this test's credentials: %+v, want root with CAP_SYS_ADMIN", host)
	}
	nobodyOnHost := Creds{EUID: nobody, UserNS: host.UserNS}
	insideOwned := credsOf(t, owned.Process.Pid)
	if insideOwned.EUID != nobody || !insideOwned.SysAdmin || insideOwned.UserNS == host.UserNS {
		t.Fatalf("credentials of root in nobody's user namespace: %+v", insideOwned)
	}
	hostNet := openNS(t, "/proc/self/ns/net")
	ownedNet := openNS(t, "/proc/"+strconv.Itoa(owned.Process.Pid)+"/ns/net")
	innerNet := openNS(t, "/proc/"+strconv.Itoa(inner.Process.Pid)+"/ns/net")
	for _, tc := range []struct {
		name string
		fd   int
		c    Creds
		want bool
	}{
		{"root, the host's", hostNet, host, true},
		{"root, nobody's", ownedNet, host, true},
		{"nobody, the host's", hostNet, nobodyOnHost, false},
		{"nobody, its own", ownedNet, nobodyOnHost, true},
		{"nobody, nested in its own", innerNet, nobodyOnHost, true},
		{"uid 1, nobody's", ownedNet, Creds{EUID: 1, UserNS: host.UserNS}, false},
		{"CAP_SYS_ADMIN on the host, not root", hostNet, Creds{EUID: 1, UserNS: host.UserNS, SysAdmin: true}, true},
		{"root inside nobody's, its own", ownedNet, insideOwned, true},
		{"root inside nobody's, without CAP_SYS_ADMIN", ownedNet, Creds{EUID: nobody, UserNS: insideOwned.UserNS}, false},
		{"root inside nobody's, the host's", hostNet, insideOwned, false},
		{"root inside nobody's, a sibling's", innerNet, insideOwned, false},
	} {
		got, err := MayEnter(tc.fd, tc.c)
		if err != nil || got != tc.want {
			t.Errorf("%s: MayEnter = %v, %v; want %v", tc.name, got, err, tc.want)
		}
	}
}

// ReadCreds refuses to speak of a process that is gone: its pid could be
// another's.
func TestReadCredsOfAProcessGone(t *testing.T) {
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pidfd, err := unix.PidfdOpen(cmd.Process.Pid, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(pidfd)
	_ = cmd.Wait()
	if _, err := ReadCreds(pidfd, cmd.Process.Pid); !errors.Is(err, ErrProcessGone) {
		t.Errorf("ReadCreds of a reaped process: %v, want ErrProcessGone", err)
	}
	// A pid reused meanwhile is another process, alive: the pidfd of the
	// first still says it is gone.
	if _, err := ReadCreds(pidfd, os.Getpid()); !errors.Is(err, ErrProcessGone) {
		t.Errorf("ReadCreds of a reaped process whose pid is now this one's: %v, want ErrProcessGone", err)
	}
}

// A passed descriptor is a network namespace's, opened for reading, or
// refused.
func TestCheckPassed(t *testing.T) {
	dir := t.TempDir()
	regular := filepath.Join(dir, "file")
	if err := os.WriteFile(regular, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	open := func(path string, flags int) int {
		fd, err := unix.Open(path, flags|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(fd) })
		return fd
	}
	var self unix.Stat_t
	if err := unix.Stat("/proc/self/ns/net", &self); err != nil {
		t.Fatal(err)
	}
	id, err := CheckPassed(open("/proc/self/ns/net", unix.O_RDONLY))
	if err != nil || id != (ID{Dev: self.Dev, Ino: self.Ino}) {
		t.Errorf("CheckPassed of this network namespace = %v, %v; want %v", id, err, ID{Dev: self.Dev, Ino: self.Ino})
	}
	for name, fd := range map[string]int{
		"O_PATH":                      open("/proc/self/ns/net", unix.O_PATH),
		"a namespace of another type": open("/proc/self/ns/mnt", unix.O_RDONLY),
		"a regular file":              open(regular, unix.O_RDONLY),
		"a FIFO":                      open(fifo, unix.O_RDWR),
		"a device":                    open("/dev/null", unix.O_RDONLY),
	} {
		if _, err := CheckPassed(fd); !errors.Is(err, ErrNotNamespace) {
			t.Errorf("CheckPassed of %s: %v, want ErrNotNamespace", name, err)
		}
	}
}

// What the daemon adds to an ADD of a caller other than root: the passed
// descriptor checked, the caller's credentials read through its pidfd, the
// walk up the user namespaces.
func BenchmarkEnterChecks(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	owned := heldIn(b, "--net")
	fd, err := unix.Open("/proc/"+strconv.Itoa(owned.Process.Pid)+"/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer unix.Close(fd)
	pid := owned.Process.Pid
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer unix.Close(pidfd)
	b.ResetTimer()
	for range b.N {
		if _, err := CheckPassed(fd); err != nil {
			b.Fatal(err)
		}
		c, err := ReadCreds(pidfd, pid)
		if err != nil {
			b.Fatal(err)
		}
		if ok, err := MayEnter(fd, c); !ok || err != nil {
			b.Fatal(ok, err)
		}
	}
}
