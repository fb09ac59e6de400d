package server_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/server"
)

// A handler takes the one descriptor its peer passed with the
// connection's first bytes, once; more on those bytes, and any on later
// ones, are closed; one not taken is closed with the connection. The
// peer's pidfd names the process that connected.
func TestPassedDescriptor(t *testing.T) {
	path := filepath.Join(t.TempDir(), "control.sock")
	lis, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	servePassedFDRoutes(t, lis)

	files := make([]*os.File, 3)
	for i := range files {
		f, err := os.Create(filepath.Join(t.TempDir(), fmt.Sprint(i)))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		files[i] = f
	}
	inode := func(f *os.File) uint64 {
		st, _ := f.Stat()
		return st.Sys().(*syscall.Stat_t).Ino
	}
	held := openFDs(t)
	for _, tc := range []struct {
		name   string
		route  string
		first  []*os.File // passed with the first bytes
		later  []*os.File // passed with the body
		answer string
	}{
		{"none", "/take", nil, nil, fmt.Sprintf("-1 -1 %d", os.Getpid())},
		{"one", "/take", files[:1], nil, fmt.Sprintf("%d -1 %d", inode(files[0]), os.Getpid())},
		{"three: the first is kept", "/take", files, nil, fmt.Sprintf("%d -1 %d", inode(files[0]), os.Getpid())},
		{"one with the body only", "/take", nil, files[1:2], fmt.Sprintf("-1 -1 %d", os.Getpid())},
		{"one never taken", "/ignore", files[:1], nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := post(t, path, tc.route, tc.first, tc.later)
			if got != tc.answer {
				t.Errorf("answer %q, want %q", got, tc.answer)
			}
		})
	}
	// Every descriptor the server received is closed: taken and closed by
	// the handler, or by the server.
	waitFor(t, func() bool { return openFDs(t) == held })
}

// servePassedFDRoutes serves on lis, until the test ends, /take, which
// answers the inode of the passed descriptor (or -1), whether a second
// take finds one, and the pid of the peer's pidfd; and /ignore, which
// takes nothing.
func servePassedFDRoutes(t *testing.T, lis net.Listener) {
	t.Helper()
	srv, err := server.New(server.Config{Listener: lis, DisableReflection: true, StopTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// /take answers the inode of the passed descriptor (or -1), whether a
	// second take finds one, and the pid of the peer's pidfd.
	if err := srv.Handle("POST /take", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		fd := server.TakePassedFD(r.Context())
		ino := int64(-1)
		if fd >= 0 {
			var st unix.Stat_t
			if err := unix.Fstat(fd, &st); err == nil {
				ino = int64(st.Ino)
			}
			unix.Close(fd)
		}
		again := server.TakePassedFD(r.Context())
		pid := -1
		if pidfd, err := server.PeerPidfd(r.Context()); err == nil {
			pid = pidOf(t, pidfd)
			unix.Close(pidfd)
		}
		fmt.Fprintf(w, "%d %d %d", ino, again, pid)
	})); err != nil {
		t.Fatal(err)
	}
	if err := srv.Handle("POST /ignore", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
	})); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	if err := srv.Serve(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Drain(context.Background()) })
}

// post sends one HTTP/1.0 request to route, passing first with its first
// bytes and later with its body, and returns the answer's body.
func post(t *testing.T, path, route string, first, later []*os.File) string {
	t.Helper()
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rights := func(fs []*os.File) []byte {
		if len(fs) == 0 {
			return nil
		}
		var fds []int
		for _, f := range fs {
			fds = append(fds, int(f.Fd()))
		}
		return unix.UnixRights(fds...)
	}
	head := fmt.Sprintf("POST %s HTTP/1.0\r\nHost: x\r\nContent-Length: 4\r\n\r\n", route)
	if _, _, err := c.WriteMsgUnix([]byte(head), rights(first), nil); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.WriteMsgUnix([]byte("body"), rights(later), nil); err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	_, body, _ := strings.Cut(string(raw), "\r\n\r\n")
	return body
}

// pidOf is the pid a pidfd names, from its fdinfo.
func pidOf(t *testing.T, pidfd int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/fdinfo/%d", pidfd))
	if err != nil {
		t.Error(err)
		return -1
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Pid:"); ok {
			var pid int
			fmt.Sscan(v, &pid)
			return pid
		}
	}
	return -1
}

// openFDs counts this process's open descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(es)
}

// waitFor polls cond until it holds, for up to 10 s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
