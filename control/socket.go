package control

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// SocketMode is the control socket's permission: its owner (root) and its
// group may connect, nobody else.
const SocketMode fs.FileMode = 0o660

// ErrSocket is wrapped by every error that refuses a control socket path.
var ErrSocket = errors.New("control socket")

// InUseError is returned for a socket path a live process answers on:
// another daemon's control socket.
type InUseError struct {
	Path string
}

func (e *InUseError) Error() string {
	return fmt.Sprintf("%v %s: a live process answers on it (another daemon?): stop it or give another --control-socket", ErrSocket, e.Path)
}

// Unwrap makes the error match [ErrSocket].
func (e *InUseError) Unwrap() error { return ErrSocket }

// maxPathLen is the longest path a Unix socket can be bound at and
// connected to: sun_path's 108 bytes, less the terminating NUL.
const maxPathLen = len(unix.RawSockaddrUnix{}.Path) - 1

// probeTimeout bounds the connect that tells a live socket from a stale
// one: a live daemon's kernel answers a Unix connect at once.
const probeTimeout = time.Second

// CheckSocket reports, creating and changing nothing, why path cannot be
// the control socket: it is a regular file, a directory or a symlink, its
// directory does not exist, or a live process answers on it. A missing
// path and a stale socket (nobody listening: a daemon killed with -9 left
// it) are fine: [Listen] replaces the stale one.
func CheckSocket(ctx context.Context, path string) error {
	stale, err := checkPath(path)
	if err != nil || !stale {
		return err
	}
	d := net.Dialer{Timeout: probeTimeout}
	c, err := d.DialContext(ctx, "unix", path)
	if err == nil {
		_ = c.Close()
		return &InUseError{Path: path}
	}
	if errors.Is(err, syscall.ECONNREFUSED) {
		return nil // stale
	}
	return fmt.Errorf("%w %s: connect to tell a live socket from a stale one: %w", ErrSocket, path, err)
}

// CheckPath is [CheckSocket] without the connect: it refuses what can
// never be the socket, and takes an existing socket for a possible one
// (an in-place upgrade checks its configuration while the old image
// serves on it).
func CheckPath(path string) error {
	_, err := checkPath(path)
	return err
}

// checkPath reports whether path is a socket already (live or stale), or
// why it cannot be one.
func checkPath(path string) (socket bool, err error) {
	if !filepath.IsAbs(path) {
		return false, fmt.Errorf("%w %q: must be an absolute path", ErrSocket, path)
	}
	if len(path) > maxPathLen {
		return false, fmt.Errorf("%w %s: %d bytes, longer than a Unix socket address can be (%d): give a shorter --control-socket", ErrSocket, path, len(path), maxPathLen)
	}
	if fi, err := os.Stat(filepath.Dir(path)); err != nil || !fi.IsDir() {
		return false, fmt.Errorf("%w %s: directory %s does not exist", ErrSocket, path, filepath.Dir(path))
	}
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("%w: %w", ErrSocket, err)
	case fi.Mode()&fs.ModeSymlink != 0:
		return false, fmt.Errorf("%w %s is a symlink: give the real path, or remove it", ErrSocket, path)
	case fi.IsDir():
		return false, fmt.Errorf("%w %s is a directory: give a file path inside it, such as %s", ErrSocket, path, filepath.Join(path, "control.sock"))
	case fi.Mode()&fs.ModeSocket == 0:
		return false, fmt.Errorf("%w %s exists and is not a socket (%v): remove it, or give another --control-socket", ErrSocket, path, fi.Mode().Type())
	}
	return true, nil
}

// SocketOptions say who may connect to the control socket.
type SocketOptions struct {
	// GID is the socket's group, whose members may connect; -1 leaves it
	// root's.
	GID int
}

// Socket is a control socket [Listen] bound: its path and the identity of
// the file, so that [Socket.Remove] never removes a socket another
// process put there since.
type Socket struct {
	Path     string
	dev, ino uint64
}

// Listen binds the control socket at path: after [CheckSocket], at a
// temporary name in the same directory, given its group and [SocketMode],
// then renamed into place, so that it is never reachable with other
// permissions and a stale socket is replaced in one step. Call it while
// holding the daemon's lock: only the lock holder may replace the path.
// The listener does not unlink the path when closed (an in-place upgrade
// hands it on): call [Socket.Remove] at an orderly stop.
func Listen(ctx context.Context, path string, opts SocketOptions) (*net.UnixListener, *Socket, error) {
	if err := CheckSocket(ctx, path); err != nil {
		return nil, nil, err
	}
	name := "." + filepath.Base(path) + ".new-" + strconv.Itoa(os.Getpid())
	tmp := filepath.Join(filepath.Dir(path), name)
	_ = os.Remove(tmp) // an earlier attempt of this pid's
	// The temporary name is longer than path, which may itself be as long
	// as a socket address can be: it is bound through a descriptor of the
	// directory, so that its length is never what fails the bind.
	dir, err := os.Open(filepath.Dir(path))
	if err != nil {
		return nil, nil, fmt.Errorf("%w %s: %w", ErrSocket, path, err)
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: "/proc/self/fd/" + strconv.Itoa(int(dir.Fd())) + "/" + name, Net: "unix"})
	_ = dir.Close()
	if err != nil {
		return nil, nil, fmt.Errorf("%w: bind %s: %w", ErrSocket, tmp, err)
	}
	l.SetUnlinkOnClose(false)
	fail := func(err error) (*net.UnixListener, *Socket, error) {
		_ = l.Close()
		_ = os.Remove(tmp)
		return nil, nil, fmt.Errorf("%w %s: %w", ErrSocket, path, err)
	}
	if opts.GID >= 0 {
		if err := os.Lchown(tmp, 0, opts.GID); err != nil {
			return fail(fmt.Errorf("chown: %w", err))
		}
	}
	if err := os.Chmod(tmp, SocketMode); err != nil {
		return fail(fmt.Errorf("chmod: %w", err))
	}
	var st unix.Stat_t
	if err := unix.Lstat(tmp, &st); err != nil {
		return fail(fmt.Errorf("stat: %w", err))
	}
	if err := os.Rename(tmp, path); err != nil {
		return fail(fmt.Errorf("rename into place: %w", err))
	}
	return l, &Socket{Path: path, dev: st.Dev, ino: st.Ino}, nil
}

// Adopt takes over a control socket handed over by an earlier image of the
// daemon (an in-place upgrade) as f; path is where it was bound.
func Adopt(f *os.File, path string) (*net.UnixListener, *Socket, error) {
	fl, err := net.FileListener(f)
	if err != nil {
		return nil, nil, fmt.Errorf("%w %s: handed over: %w", ErrSocket, path, err)
	}
	l, ok := fl.(*net.UnixListener)
	if !ok {
		_ = fl.Close()
		return nil, nil, fmt.Errorf("%w %s: handed over a %s socket, not a Unix one", ErrSocket, path, fl.Addr().Network())
	}
	l.SetUnlinkOnClose(false)
	s := &Socket{Path: path}
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err == nil {
		s.dev, s.ino = st.Dev, st.Ino
	}
	return l, s, nil
}

// Remove unlinks the socket's path if it is still this socket; a path
// that is gone, or that another process bound since, is left alone.
func (s *Socket) Remove() error {
	var st unix.Stat_t
	if err := unix.Lstat(s.Path, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("%w %s: stat: %w", ErrSocket, s.Path, err)
	}
	if st.Dev != s.dev || st.Ino != s.ino {
		return nil
	}
	if err := os.Remove(s.Path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: %w", ErrSocket, err)
	}
	return nil
}

// OpenDir lets group gid reach the sockets in dir, a directory the daemon
// owns (its state directory): search permission for the group (0710, group
// gid), never listing or writing. Others get nothing.
func OpenDir(dir string, gid int) error {
	if err := os.Lchown(dir, 0, gid); err != nil {
		return fmt.Errorf("%w: let group %d reach %s: %w", ErrSocket, gid, dir, err)
	}
	if err := os.Chmod(dir, 0o710); err != nil {
		return fmt.Errorf("%w: let group %d reach %s: %w", ErrSocket, gid, dir, err)
	}
	return nil
}

// LookupGroup resolves a group name or number for the socket.
func LookupGroup(name string) (int, error) {
	if n, err := strconv.ParseUint(name, 10, 31); err == nil {
		return int(n), nil
	}
	g, err := user.LookupGroup(name)
	if err != nil {
		return -1, fmt.Errorf("%w: group %q: %w", ErrSocket, name, err)
	}
	return strconv.Atoi(g.Gid)
}
