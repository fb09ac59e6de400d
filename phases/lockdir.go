package phases

import (
	"errors"
	"fmt"
	"os"

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
// refuses it, as a configuration error, unless only root controls it. It
// is checked again here, by the descriptor opened, and not only by
// Validate: another user may have made it since.
func (c Config) ensureStateDir() error {
	dir, err := rootdir.Ensure(c.StateDir, 0o700)
	if err != nil {
		return asConfig(fmt.Errorf("state directory %w", err))
	}
	defer dir.Close()
	return writable(c.StateDir, dir.File())
}

// writable refuses a state directory on a read-only filesystem, before
// anything is made there: the daemon writes every lease there before it
// answers. It is an I/O fault of the host, not of the configuration (exit
// 1, not 2): the same flags serve once the filesystem is writable again.
func writable(path string, dir *os.File) error {
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(dir.Fd()), &st); err != nil {
		return fmt.Errorf("state directory %s: statfs: %w", path, err)
	}
	if st.Flags&unix.ST_RDONLY != 0 {
		return fmt.Errorf("state directory %s is on a read-only filesystem: the daemon records every lease there before it answers; remount it read-write: %w", path, unix.EROFS)
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
