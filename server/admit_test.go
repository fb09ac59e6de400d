package server

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A surface that knows its callers (Config.Admit) closes the peers it
// refuses at accept, before they hold any share of the bounds, and keeps
// PermittedConns for the peers it permits: ordinary peers fill their part
// and no more, permitted ones still get in, root still gets its own.
func TestAdmitAtAccept(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the peers connect as other users")
	}
	const permitted, permitted2, ordinary, ordinary2, stranger = 65534, 65530, 65533, 65531, 65532
	// Every user must reach the socket: t.TempDir's parent is 0700.
	dir, err := os.MkdirTemp("", "server-admit-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "s.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o777); err != nil {
		t.Fatal(err)
	}
	asked := make(chan uint32, 64)
	cfg := DefaultConfig()
	cfg.Listener, cfg.DrainDelay, cfg.StopTimeout = l, 0, time.Second
	cfg.Limits = Limits{MaxConns: 7, PrivilegedConns: 1, PermittedConns: 3, MaxConnsPerPeer: 2}
	cfg.Admit = func(cred *PeerCred) PeerClass {
		if cred == nil {
			return PeerRefused
		}
		asked <- cred.UID
		switch cred.UID {
		case permitted, permitted2:
			return PeerPermitted
		case ordinary, ordinary2:
			return PeerOrdinary
		}
		return PeerRefused
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Handle("GET /ok", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })); err != nil {
		t.Fatal(err)
	}
	if err := s.Serve(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Drain(context.Background()) })

	for i, st := range []struct {
		uid     int
		refused bool
	}{
		// Refused whatever is free.
		{stranger, true}, {stranger, true},
		// The ordinary part, 7 - 1 - 3, then no more.
		{ordinary, false}, {ordinary, false}, {ordinary2, false}, {ordinary2, true},
		// A permitted peer's bound, then the unprivileged part, 6.
		{permitted, false}, {permitted, false}, {permitted, true}, {permitted2, false}, {permitted2, true},
		// Root's part, then the total.
		{0, false}, {0, true},
	} {
		h := ask(t, dialUnixAs(t, st.uid, path))
		if st.refused != h.refused() || !st.refused && h.err != nil {
			t.Fatalf("step %d: uid %d: %v, want refused %v", i, st.uid, h.err, st.refused)
		}
	}
	st := s.ConnStats()
	if st.Open != 7 || st.RefusedAdmission != 2 || st.RefusedPerPeer != 1 || st.RefusedTotal != 3 {
		t.Errorf("ConnStats = %+v, want 7 open, 2 refused for their peer, 1 per peer and 3 in total", st)
	}
	close(asked)
	for uid := range asked {
		if uid == 0 {
			t.Error("Admit was asked about root")
		}
	}
}

// dialUnixAs connects to the Unix socket at path as uid (its effective
// uid, which the kernel records for SO_PEERCRED): setresuid changes the
// calling thread's credentials only when made as a raw system call, so it
// is done on a thread of its own.
func dialUnixAs(t *testing.T, uid int, path string) net.Conn {
	t.Helper()
	type made struct {
		fd  int
		err error
	}
	ch := make(chan made, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with its changed credentials
		if uid != os.Geteuid() {
			if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, ^uintptr(0), uintptr(uid), ^uintptr(0)); e != 0 {
				ch <- made{-1, e}
				return
			}
		}
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err == nil {
			if err = unix.Connect(fd, &unix.SockaddrUnix{Name: path}); err != nil {
				unix.Close(fd)
			}
		}
		ch <- made{fd, err}
	}()
	m := <-ch
	if m.err != nil {
		t.Fatal(m.err)
	}
	f := os.NewFile(uintptr(m.fd), "socket")
	defer f.Close()
	c, err := net.FileConn(f)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
