package phases

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/internal/rootdir"
	"github.com/phasegate/phasegate/phases/lockfile"
)

// asConfig makes a refusal of a directory another user could change, or
// of a link where a file of the daemon's should be, a configuration error
// (exit 2): the operator must fix the host. Other errors are returned as
// they are.
func asConfig(err error) error {
	var unsafe *rootdir.UnsafeError
	var link *rootdir.LinkError
	if errors.As(err, &unsafe) || errors.As(err, &link) {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return err
}

// ensureStateDir makes the state directory (0700) if it is missing, and
// refuses it, as a configuration error, unless only root controls it and
// the daemon can write there. It is checked again here, by the descriptor
// opened, and not only by Validate: another user may have made it since,
// or its filesystem have been remounted.
func (c Config) ensureStateDir() error {
	dir, err := rootdir.Ensure(c.StateDir, 0o700)
	if err != nil {
		var unsafe *rootdir.UnsafeError
		var link *rootdir.LinkError
		if errors.As(err, &unsafe) || errors.As(err, &link) {
			return asConfig(fmt.Errorf("state directory %w", err))
		}
		return fmt.Errorf("%w: --state-dir: %w", ErrConfig, err)
	}
	defer dir.Close()
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(dir.File().Fd()), &st); err != nil {
		return fmt.Errorf("state directory %s: statfs: %w", c.StateDir, err)
	}
	if err := readOnly(c.StateDir, st); err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return nil
}

// stateDirWritable refuses, before anything is made, a state directory
// the daemon cannot write: on a read-only filesystem, or (a daemon not
// run as root) in a directory it may not write. A directory still to be
// made is judged by its parent, which checkRootDir found. Either is a
// configuration error (exit 2): the daemon records every lease there
// before it answers, so no start can succeed until the flag or the host
// is changed, as with a port in use.
func stateDirWritable(path string) error {
	at := path
	if _, err := os.Lstat(path); errors.Is(err, fs.ErrNotExist) {
		at = filepath.Dir(path)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(at, &st); err != nil {
		return fmt.Errorf("--state-dir %s: statfs %s: %w", path, at, err)
	}
	if err := readOnly(path, st); err != nil {
		return err
	}
	if err := unix.Access(at, unix.W_OK); err != nil {
		return fmt.Errorf("--state-dir %s: %s is not writable by this process (uid %d): %w; run the daemon as root", path, at, os.Geteuid(), err)
	}
	return nil
}

// readOnly refuses a state directory whose filesystem (st) is read-only.
func readOnly(path string, st unix.Statfs_t) error {
	if st.Flags&unix.ST_RDONLY != 0 {
		return fmt.Errorf("--state-dir %s is on a read-only filesystem: the daemon records every lease there before it answers; remount it read-write, or give another --state-dir: %w", path, unix.EROFS)
	}
	return nil
}

// adoptLock takes over a lock the previous image handed over as f: at
// path, or at legacy when that image was a build that kept its locks in
// lockfile.LegacyDir. Such a lock is taken again at path (take) before the
// old one is let go, so that what it guards is never unguarded, and from
// then on only path is held and handed over.
func (d *Daemon) adoptLock(f *os.File, path, legacy string, take func() (*lockfile.Lock, error)) (*lockfile.Lock, error) {
	var former []string
	if legacy != path {
		former = append(former, legacy)
	}
	l, at, err := lockfile.Adopt(f, path, former...)
	if err != nil || at == path {
		return l, err
	}
	moved, err := take()
	if uerr := l.Unlock(); uerr != nil {
		d.log.Warn("letting go of the lock an older build kept", "path", at, "error", uerr)
	}
	if err != nil {
		return nil, fmt.Errorf("the lock handed over at %s, taken again at %s: %w", at, path, err)
	}
	d.log.Info("lock moved from where older builds kept it", "from", at, "to", path)
	return moved, nil
}
