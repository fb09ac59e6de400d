package control_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/phasegate/phasegate/control"
)

// Every path that cannot be the control socket is refused with an error
// naming it, and left exactly as it was.
func TestListenRefusesWhatIsNotASocket(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, []byte("keep me"), 0o644); err != nil {
		t.Fatal(err)
	}
	sub := filepath.Join(dir, "dir")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(filepath.Join(dir, "elsewhere.sock"), link); err != nil {
		t.Fatal(err)
	}
	live := filepath.Join(dir, "live.sock")
	l, err := net.Listen("unix", live)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	// Directories another user could write: the socket is never bound
	// there, nor the temporary name renamed.
	open := map[string]os.FileMode{"world": 0o777, "sticky": os.ModeSticky | 0o777, "group": 0o770}
	others := t.TempDir()
	for name, mode := range open {
		if err := os.Mkdir(filepath.Join(others, name), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(filepath.Join(others, name), mode); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name, path string
		inUse      bool
	}{
		{"a regular file", file, false},
		{"a directory", sub, false},
		{"a symlink", link, false},
		{"a live socket", live, true},
		{"a relative path", "control.sock", false},
		{"in a missing directory", filepath.Join(dir, "missing", "control.sock"), false},
		{"in a world-writable directory", filepath.Join(others, "world", "control.sock"), false},
		{"in a sticky world-writable directory", filepath.Join(others, "sticky", "control.sock"), false},
		{"in a group-writable directory", filepath.Join(others, "group", "control.sock"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before, _ := os.Lstat(tc.path)
			_, _, err := control.Listen(ctx, tc.path, control.SocketOptions{GID: -1})
			var inUse *control.InUseError
			if !errors.Is(err, control.ErrSocket) || errors.As(err, &inUse) != tc.inUse {
				t.Fatalf("Listen(%s): %v", tc.path, err)
			}
			if after, _ := os.Lstat(tc.path); before != nil && (after == nil || !os.SameFile(before, after)) {
				t.Fatalf("Listen(%s) changed the path", tc.path)
			}
		})
	}
	if b, _ := os.ReadFile(file); string(b) != "keep me" {
		t.Fatal("the regular file was changed")
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 4 { // file, dir, link, live.sock
		t.Fatalf("Listen left something behind in %s: %v", dir, entries)
	}
	for name := range open {
		if entries, _ := os.ReadDir(filepath.Join(others, name)); len(entries) != 0 {
			t.Errorf("Listen made %v in the %s-writable directory", entries, name)
		}
	}
}

// A socket nobody listens on (a daemon killed with -9 left it) is replaced;
// the new one has the socket's mode; Remove removes only it.
func TestListenReplacesAStaleSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "control.sock")
	stale, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	stale.Close()
	l, sock, err := control.Listen(context.Background(), path, control.SocketOptions{GID: os.Getgid()})
	if err != nil {
		t.Fatalf("Listen over a stale socket: %v", err)
	}
	defer l.Close()
	fi, err := os.Lstat(path)
	if err != nil || fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != control.SocketMode {
		t.Fatalf("socket %v %v, want a socket of mode %v", fi.Mode(), err, control.SocketMode)
	}
	if gid := fi.Sys().(*syscall.Stat_t).Gid; int(gid) != os.Getgid() {
		t.Fatalf("socket group %d, want %d", gid, os.Getgid())
	}
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatalf("dial the new socket: %v", err)
	}
	c.Close()

	// Another process's socket at the path since is not ours to remove.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	other, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := sock.Remove(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(path); err != nil {
		t.Fatalf("Remove removed another socket: %v", err)
	}
}
