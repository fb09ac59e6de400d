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

	"github.com/phasegate/phasegate/internal/rootdir"
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
// directory does not exist or is one a user other than root could change
// (an error matching *rootdir.UnsafeError), or a live process answers on
// it. A missing
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
	// Another user who can write the directory could put its own socket
	// at the path, or rename over ours, and hear root's calls.
	if err := rootdir.Check(filepath.Dir(path)); err != nil {
		return false, fmt.Errorf("%w %s: %w", ErrSocket, path, err)
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
// permissions and a stale socket is replaced in one step. Every step is
// taken through a descriptor of the directory, checked as one only root
// controls: no other user can make, move or replace a name in it, so
// nobody can race the rename. Call it while holding the daemon's lock:
// only the lock holder may replace the path. The listener does not unlink
// the path when closed (an in-place upgrade hands it on): call
// [Socket.Remove] at an orderly stop.
func Listen(ctx context.Context, path string, opts SocketOptions) (*net.UnixListener, *Socket, error) {
	if err := CheckSocket(ctx, path); err != nil {
		return nil, nil, err
	}
	dir, err := rootdir.Open(filepath.Dir(path))
	if err != nil {
		return nil, nil, fmt.Errorf("%w %s: %w", ErrSocket, path, err)
	}
	defer dir.Close()
	name := "." + filepath.Base(path) + ".new-" + strconv.Itoa(os.Getpid())
	_ = dir.Remove(name) // an earlier attempt of this pid's
	// The temporary name is longer than path, which may itself be as long
	// as a socket address can be: it is bound through the directory's
	// descriptor, so that its length is never what fails the bind, and the
	// bind is in the directory checked.
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: "/proc/self/fd/" + strconv.Itoa(int(dir.File().Fd())) + "/" + name, Net: "unix"})
	if err != nil {
		return nil, nil, fmt.Errorf("%w: bind %s: %w", ErrSocket, dir.Join(name), err)
	}
	l.SetUnlinkOnClose(false)
	fail := func(err error) (*net.UnixListener, *Socket, error) {
		_ = l.Close()
		_ = dir.Remove(name)
		return nil, nil, fmt.Errorf("%w %s: %w", ErrSocket, path, err)
	}
	st, err := share(dir, name, opts.GID)
	if err != nil {
		return fail(err)
	}
	if err := dir.Rename(name, filepath.Base(path)); err != nil {
		return fail(fmt.Errorf("into place: %w", err))
	}
	return l, &Socket{Path: path, dev: st.Dev, ino: st.Ino}, nil
}

// share gives the socket file name in dir its group (gid, unless -1) and
// [SocketMode], on the file itself: opened without following a link
// (O_PATH), checked to be a socket, changed through that descriptor.
func share(dir *rootdir.Dir, name string, gid int) (unix.Stat_t, error) {
	var st unix.Stat_t
	f, err := dir.OpenFile(name, unix.O_PATH, 0)
	if err != nil {
		return st, err
	}
	defer f.Close()
	fd := int(f.Fd())
	if err := unix.Fstat(fd, &st); err != nil {
		return st, fmt.Errorf("fstat %s: %w", f.Name(), err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return st, fmt.Errorf("%s is not the socket bound", f.Name())
	}
	if gid >= 0 {
		if err := unix.Fchownat(fd, "", 0, gid, unix.AT_EMPTY_PATH); err != nil {
			return st, fmt.Errorf("chown %s: %w", f.Name(), err)
		}
	}
	// chmod has no form for an O_PATH descriptor but its /proc link, which
	// names the file opened.
	if err := unix.Chmod("/proc/self/fd/"+strconv.Itoa(fd), uint32(SocketMode)); err != nil {
		return st, fmt.Errorf("chmod %s: %w", f.Name(), err)
	}
	return st, nil
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
	dir, err := rootdir.Open(filepath.Dir(s.Path))
	if err != nil {
		return fmt.Errorf("%w %s: %w", ErrSocket, s.Path, err)
	}
	defer dir.Close()
	name := filepath.Base(s.Path)
	st, err := dir.Stat(name)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("%w: %w", ErrSocket, err)
	case st.Dev != s.dev || st.Ino != s.ino:
		return nil
	}
	if err := dir.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: %w", ErrSocket, err)
	}
	return nil
}

// OpenDir lets group gid reach the sockets in dir, a directory the daemon
// owns (its state directory): search permission for the group (0710, group
// gid), never listing or writing. Others get nothing. The directory is
// changed through a descriptor of it, opened without following a link and
// checked as one only root controls.
func OpenDir(dir string, gid int) error {
	d, err := rootdir.Open(dir)
	if err != nil {
		return fmt.Errorf("%w: let group %d reach %s: %w", ErrSocket, gid, dir, err)
	}
	defer d.Close()
	if err := d.File().Chown(0, gid); err != nil {
		return fmt.Errorf("%w: let group %d reach %s: %w", ErrSocket, gid, dir, err)
	}
	if err := d.File().Chmod(0o710); err != nil {
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
