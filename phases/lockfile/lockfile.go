package lockfile

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// HeldError reports a lock held by another process.
type HeldError struct {
	// Path is the lock file.
	Path string
	// PID is the holder's pid as recorded in the file; 0 if it could not be
	// read (the holder may not have written it yet).
	PID int
}

func (e *HeldError) Error() string {
	if e.PID == 0 {
		return fmt.Sprintf("%s is locked by another process", e.Path)
	}
	return fmt.Sprintf("%s is locked by pid %d", e.Path, e.PID)
}

// Lock is a held lock. Release it with Unlock.
type Lock struct {
	f *os.File
}

// pollInterval is how often Acquire retries while waiting: flock(2) cannot
// be interrupted by a ctx, so waiting is done by polling.
const pollInterval = 50 * time.Millisecond

// Acquire takes an exclusive lock on path, creating the file (mode 0600) if
// needed, and writes the caller's pid into it. With wait 0 a held lock fails
// at once with a *[HeldError]; otherwise Acquire retries until wait has passed
// or ctx ends.
func Acquire(ctx context.Context, path string, wait time.Duration) (*Lock, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lockfile: open %s: %w", path, err)
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
			f.Close()
			return nil, &HeldError{Path: path, PID: holderPID(ctx, path)}
		}
		t := time.NewTimer(min(pollInterval, time.Until(deadline)))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			f.Close()
			return nil, fmt.Errorf("lockfile: waiting for %s (held by pid %d): %w", path, readPID(path), context.Cause(ctx))
		}
	}
	if err := writePID(f); err != nil {
		f.Close() // closing releases the flock
		return nil, fmt.Errorf("lockfile: write pid to %s: %w", path, err)
	}
	return &Lock{f: f}, nil
}

func writePID(f *os.File) error {
	if err := f.Truncate(0); err != nil {
		return err
	}
	_, err := f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return err
}

// holderPID reads the holder's pid. A holder writes it right after it
// locks, so a lock taken a moment ago may not show it yet: wait briefly
// rather than report an anonymous holder.
func holderPID(ctx context.Context, path string) int {
	for range 20 {
		if pid := readPID(path); pid != 0 {
			return pid
		}
		select {
		case <-time.After(10 * time.Millisecond):
		case <-ctx.Done():
			return 0
		}
	}
	return 0
}

// readPID returns the pid recorded in path, or 0.
func readPID(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0
	}
	return pid
}

// Path returns the lock file's path.
func (l *Lock) Path() string { return l.f.Name() }

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

// EnsureDir creates dir with mode 0700 if it does not exist; its parent must
// exist. An existing dir must be a directory and not a symlink.
func EnsureDir(dir string) error {
	fi, err := os.Lstat(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		if _, err := os.Stat(filepath.Dir(dir)); err != nil {
			return fmt.Errorf("state dir %s: parent: %w", dir, err)
		}
		if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("state dir: %w", err)
		}
		return nil
	case err != nil:
		return fmt.Errorf("state dir: %w", err)
	case fi.Mode()&os.ModeSymlink != 0:
		return fmt.Errorf("state dir %s is a symlink", dir)
	case !fi.IsDir():
		return fmt.Errorf("state dir %s is not a directory", dir)
	}
	return nil
}

// Probe reports whether another process holds the lock on path, and its
// pid, without creating anything: a missing file is not held. It lets a
// command refuse to run beside a daemon before it changes anything.
func Probe(path string) (held bool, pid int, err error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if errors.Is(err, os.ErrNotExist) {
		return false, 0, nil
	}
	if err != nil {
		return false, 0, fmt.Errorf("lockfile: open %s: %w", path, err)
	}
	defer f.Close()
	switch err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); {
	case err == nil:
		return false, 0, nil // closing f releases it again
	case errors.Is(err, unix.EWOULDBLOCK):
		return true, readPID(path), nil
	default:
		return false, 0, fmt.Errorf("lockfile: flock %s: %w", path, err)
	}
}
