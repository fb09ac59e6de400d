package lockfile

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/internal/rootdir"
)

// DefaultDir is where the slot locks live. It is one directory for the
// whole host, whatever each daemon's state directory: what must be
// exclusive is what reclaim mutates, the slots of one prefix in one netns
// directory, and two daemons that disagree on where their state lives must
// still find each other's lock. It is directly under /run, which only root
// writes, so no other user can make it first (under the world-writable
// /run/lock anyone could, and hold its locks: every start refused), and
// on tmpfs, so a reboot clears it with the namespaces.
const DefaultDir = "/run/phasegate-locks"

// LegacyDir is where builds before DefaultDir kept their locks. Only the
// locks such a build hands over across an in-place upgrade are looked for
// there; nothing else is read or made in it.
const LegacyDir = "/run/lock/phasegate"

// HeldError reports a lock held by another process.
type HeldError struct {
	// Path is the lock file.
	Path string
	// PID is the holder's pid; 0 when it could not be found (the holder
	// may have died a moment ago, or not have written it yet).
	PID int
}

func (e *HeldError) Error() string {
	if e.PID == 0 {
		return fmt.Sprintf("%s is locked by another process (pid unknown)", e.Path)
	}
	return fmt.Sprintf("%s is locked by pid %d", e.Path, e.PID)
}

// Holder describes the holder for a message: "pid 1234" or "a process
// whose pid is unknown".
func (e *HeldError) Holder() string {
	if e.PID == 0 {
		return "a process whose pid is unknown"
	}
	return "pid " + strconv.Itoa(e.PID)
}

// Lock is a held lock. Release it with Unlock.
type Lock struct {
	f *os.File
}

// pollInterval is how often Acquire retries while waiting: flock(2) cannot
// be interrupted by a ctx, so waiting is done by polling.
const pollInterval = 50 * time.Millisecond

// SlotsPath returns the lock file that guards the slots named with prefix
// in netnsDir, in lockDir. The netns directory is resolved through
// symlinks first (/var/run/netns and /run/netns are one directory on
// Debian), so every spelling of one directory maps to one lock. The name
// is the escaped directory and the prefix; one too long for a file name is
// hashed.
func SlotsPath(lockDir, netnsDir, prefix string) (string, error) {
	if !filepath.IsAbs(lockDir) {
		return "", fmt.Errorf("lockfile: lock directory %q is not absolute", lockDir)
	}
	dir, err := resolve(netnsDir)
	if err != nil {
		return "", err
	}
	name := "slots" + url.PathEscape(dir) + "@" + url.PathEscape(prefix) + ".lock"
	if len(name) > 255 {
		sum := sha256.Sum256([]byte(dir + "\x00" + prefix))
		name = "slots-" + hex.EncodeToString(sum[:]) + ".lock"
	}
	return filepath.Join(lockDir, name), nil
}

// resolve returns dir with symlinks resolved; a directory that does not
// exist yet is resolved through its nearest existing parent.
func resolve(dir string) (string, error) {
	if !filepath.IsAbs(dir) {
		return "", fmt.Errorf("lockfile: directory %q is not absolute", dir)
	}
	var rest []string
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		r, err := filepath.EvalSymlinks(d)
		if err == nil {
			return filepath.Join(append([]string{r}, rest...)...), nil
		}
		if !errors.Is(err, os.ErrNotExist) || d == "/" {
			return "", fmt.Errorf("lockfile: resolve %s: %w", dir, err)
		}
		rest = append([]string{filepath.Base(d)}, rest...)
	}
}

// Acquire takes an exclusive lock on path, creating the file (mode 0600)
// and its directory (mode 0700) if needed, and writes the caller's pid into
// it. The directory must be one only root controls (an error matching
// *rootdir.UnsafeError refuses another, changing nothing): a lock in a
// directory another user can write is that user's to take first. The file
// is opened through the directory, never through a link. With wait 0 a
// held lock fails at once with a *[HeldError]; otherwise Acquire retries
// until wait has passed or ctx ends.
//
// The lock is a flock(2) on the file's open file description: it survives
// an execve of the process as long as the descriptor stays open (see
// [Lock.File]), and the kernel drops it when the holder dies.
func Acquire(ctx context.Context, path string, wait time.Duration) (*Lock, error) {
	dir, err := rootdir.Ensure(filepath.Dir(path), 0o700)
	if err != nil {
		return nil, fmt.Errorf("lockfile: lock directory: %w", err)
	}
	defer dir.Close()
	return acquireIn(ctx, dir, filepath.Base(path), wait)
}

// acquireIn is [Acquire] of the file name in dir.
func acquireIn(ctx context.Context, dir *rootdir.Dir, name string, wait time.Duration) (*Lock, error) {
	path := dir.Join(name)
	f, err := dir.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lockfile: %w", err)
	}
	// A file left by an older run, or made by hand, may be more open.
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return nil, fmt.Errorf("lockfile: chmod %s: %w", path, err)
	}
	deadline := time.Now().Add(wait)
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lockfile: flock %s: %w", path, err)
		}
		if !time.Now().Before(deadline) {
			held := &HeldError{Path: path, PID: holderPID(ctx, f)}
			f.Close()
			return nil, held
		}
		t := time.NewTimer(min(pollInterval, time.Until(deadline)))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			held := &HeldError{Path: path, PID: holderPID(context.WithoutCancel(ctx), f)}
			f.Close()
			return nil, fmt.Errorf("lockfile: waiting for %s (held by %s): %w", path, held.Holder(), context.Cause(ctx))
		}
	}
	if err := writePID(f); err != nil {
		f.Close() // closing releases the flock
		return nil, fmt.Errorf("lockfile: write pid to %s: %w", path, err)
	}
	return &Lock{f: f}, nil
}

// Adopt takes over a lock whose descriptor this process inherited across
// an execve (the old image passed it on), and f with it: the Lock owns f
// from now on, and closes it on failure. f must be the file at path, or at
// one of former (where an older build kept it, such as in [LegacyDir]);
// Adopt returns which, checks that the lock is still ours to hold, and
// records our pid (unchanged by an exec, but the file may have been
// truncated).
func Adopt(f *os.File, path string, former ...string) (l *Lock, at string, err error) {
	fd := f.Fd()
	var byFD unix.Stat_t
	if err := unix.Fstat(int(fd), &byFD); err != nil {
		f.Close()
		return nil, "", fmt.Errorf("lockfile: adopt %s: fstat %d: %w", path, fd, err)
	}
	for _, p := range append([]string{path}, former...) {
		var byPath unix.Stat_t
		if err := unix.Lstat(p, &byPath); err == nil && byFD.Dev == byPath.Dev && byFD.Ino == byPath.Ino {
			at = p
			break
		}
	}
	if at == "" {
		f.Close()
		return nil, "", fmt.Errorf("lockfile: adopt %s: descriptor %d is another file", path, fd)
	}
	// Taking a flock we already hold through this open file description
	// succeeds at once; one held elsewhere fails.
	if err := unix.Flock(int(fd), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, "", fmt.Errorf("lockfile: adopt %s: flock: %w", at, err)
	}
	unix.CloseOnExec(int(fd))
	if err := writePID(f); err != nil {
		f.Close()
		return nil, "", fmt.Errorf("lockfile: adopt %s: write pid: %w", at, err)
	}
	return &Lock{f: f}, at, nil
}

func writePID(f *os.File) error {
	if err := f.Truncate(0); err != nil {
		return err
	}
	_, err := f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return err
}

// holderPID finds the holder of the lock on f's file. The kernel's lock
// table (/proc/locks) names the process that took a flock, with no window:
// the pid the holder writes into the file comes a moment after its flock,
// so a loser reading the file at once may find it empty. The file is the
// fallback, waited for briefly; 0 means not known.
func holderPID(ctx context.Context, f *os.File) int {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err == nil {
		if pid := flockHolder("/proc/locks", st); pid > 0 {
			return pid
		}
	}
	deadline := time.Now().Add(time.Second)
	for {
		if pid := readPID(f); pid != 0 {
			return pid
		}
		if time.Now().After(deadline) {
			return 0
		}
		select {
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
			return 0
		}
	}
}

// flockHolder returns the pid of the process holding a granted FLOCK on
// the file st describes, from a /proc/locks table, or 0.
//
//	1: FLOCK  ADVISORY  WRITE 1234 00:1a:56789 0 EOF
//	1: -> FLOCK  ADVISORY  WRITE 1235 00:1a:56789 0 EOF   (a waiter)
func flockHolder(table string, st unix.Stat_t) int {
	f, err := os.Open(table)
	if err != nil {
		return 0
	}
	defer f.Close()
	want := fmt.Sprintf("%02x:%02x:%d", unix.Major(st.Dev), unix.Minor(st.Dev), st.Ino)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 || fields[1] != "FLOCK" || fields[5] != want {
			continue // another kind, a waiter ("->"), or another file
		}
		if pid, err := strconv.Atoi(fields[4]); err == nil && pid > 0 {
			return pid
		}
	}
	return 0
}

// readPID returns the pid recorded in the lock file f, or 0.
func readPID(f *os.File) int {
	b := make([]byte, 32)
	n, err := f.ReadAt(b, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b[:n])))
	if err != nil || pid <= 0 {
		return 0
	}
	return pid
}

// File returns the descriptor that holds the lock, for handing it to a new
// image of this process across an execve (clear its close-on-exec flag
// first). The Lock still owns it.
func (l *Lock) File() *os.File { return l.f }

// Unlock clears the recorded pid and releases the lock. The file stays:
// removing it would let a waiter lock a file that a newcomer then replaces.
// Unlock is idempotent.
func (l *Lock) Unlock() error {
	if l == nil || l.f == nil {
		return nil
	}
	f := l.f
	l.f = nil
	terr := f.Truncate(0)
	if err := f.Close(); err != nil {
		return fmt.Errorf("lockfile: close %s: %w", f.Name(), err)
	}
	if terr != nil {
		return fmt.Errorf("lockfile: clear %s: %w", f.Name(), terr)
	}
	return nil
}

// Probe reports whether another process holds the lock on path, and its
// pid (0 when unknown), without creating anything: a missing file or
// directory is not held. It lets a command refuse to run beside a daemon
// before it changes anything. Like [Acquire], it opens the file through
// its directory, which only root may control, and never through a link.
func Probe(ctx context.Context, path string) (held bool, pid int, err error) {
	dir, err := rootdir.Open(filepath.Dir(path))
	if errors.Is(err, fs.ErrNotExist) {
		return false, 0, nil
	}
	if err != nil {
		return false, 0, fmt.Errorf("lockfile: lock directory: %w", err)
	}
	defer dir.Close()
	return probeIn(ctx, dir, filepath.Base(path))
}

// probeIn is [Probe] of the file name in dir.
func probeIn(ctx context.Context, dir *rootdir.Dir, name string) (held bool, pid int, err error) {
	f, err := dir.OpenFile(name, os.O_RDONLY, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return false, 0, nil
	}
	if err != nil {
		return false, 0, fmt.Errorf("lockfile: %w", err)
	}
	defer f.Close()
	switch err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); {
	case err == nil:
		return false, 0, nil // closing f releases it again
	case errors.Is(err, unix.EWOULDBLOCK):
		return true, holderPID(ctx, f), nil
	default:
		return false, 0, fmt.Errorf("lockfile: flock %s: %w", f.Name(), err)
	}
}
