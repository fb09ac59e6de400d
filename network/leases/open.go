package leases

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
	"golang.org/x/sys/unix"
)

// Open opens the store at path, creating it (mode 0600) if there is no
// file; the directory must exist. It takes the file's lock (see
// Options.LockTimeout), checks the whole file and upgrades an older schema.
//
// Open never panics on what it reads. Its typed errors: *LockedError (held
// by another process), *CorruptError (not a usable lease store: MoveAside
// it), *AccessError (cannot be read or written), *SchemaError (written by a
// newer build), and an error matching ErrNoSpace (no room to create or
// upgrade it). A file Open creates and cannot finish is removed again.
func Open(path string, opts Options) (*Store, error) {
	return open(path, opts, migrations)
}

func open(path string, opts Options, migs []migration) (*Store, error) {
	if opts.LockTimeout < 0 {
		return nil, fmt.Errorf("%w: negative lock timeout %v", ErrInvalid, opts.LockTimeout)
	}
	existed, empty := true, false
	switch st, err := os.Stat(path); {
	case errors.Is(err, fs.ErrNotExist):
		existed = false
	case err != nil && isAccess(err):
		return nil, &AccessError{Path: path, Err: err}
	case err != nil:
		return nil, fmt.Errorf("leases: %w", err)
	case !st.Mode().IsRegular():
		return nil, &CorruptError{Path: path, Err: fmt.Errorf("not a regular file (%v)", st.Mode().Type())}
	default:
		empty = st.Size() == 0
	}
	// undo removes what a failed Open wrote into a file it made, or into an
	// empty one (which it treats as new).
	undo := func() {
		if !existed {
			os.Remove(path)
		} else if empty {
			os.Truncate(path, 0)
		}
	}

	fsync, err := wantFsync(path, opts.Sync)
	if err != nil {
		return nil, err
	}
	db, err := openBolt(path, opts, fsync)
	if err != nil {
		var locked *LockedError
		if !errors.As(err, &locked) {
			undo()
		}
		return nil, err
	}
	s := &Store{path: path, db: db, opened: Opened{Fsync: fsync}}
	if err := s.prepare(migs); err != nil {
		undo() // while the lock is still ours
		db.Close()
		return nil, err
	}
	if err := s.openJournal(); err != nil {
		undo()
		db.Close()
		return nil, err
	}
	if !existed || s.opened.Fresh {
		// The directory entries of the file and its journal must outlive
		// a crash too.
		if err := syncDir(filepath.Dir(path)); err != nil {
			s.jnl.close()
			db.Close()
			return nil, fmt.Errorf("leases: %w", err)
		}
	}
	s.kick, s.full = make(chan struct{}, 1), make(chan struct{}, 1)
	s.stopLoop, s.loopDone = make(chan struct{}), make(chan struct{})
	go s.checkpointLoop()
	return s, nil
}

// openJournal opens the journal beside the file and reads the changes it
// holds that the file does not. A fresh file's journal belongs to a file
// that is gone (removed, or moved aside without it): its changes would
// bring back a part of that file's records, so it is moved aside too,
// beside the file's own name with .orphan-<UTC time>.
func (s *Store) openJournal() error {
	jpath := s.path + JournalSuffix
	if s.opened.Fresh {
		if st, err := os.Stat(jpath); err == nil && st.Size() > 0 {
			dst := jpath + orphanInfix + time.Now().UTC().Format(asideTime)
			if err := unix.Renameat2(unix.AT_FDCWD, jpath, unix.AT_FDCWD, dst, unix.RENAME_NOREPLACE); err != nil {
				return fmt.Errorf("leases: rename the journal of a file that is gone, %s, to %s: %w", jpath, dst, err)
			}
			s.opened.OrphanJournal = dst
		}
	}
	s.pending, s.group = newChangeSet(), newChangeSet()
	j, n, err := openJournal(jpath, s.opened.Fsync, s.pending)
	if err != nil {
		return err
	}
	s.jnl, s.opened.Replayed = j, n
	return nil
}

// openBolt runs bolt.Open with its faults contained: bbolt reads the meta
// and freelist pages while opening, and a damaged or missing page can make
// it panic or fault, leaving its file (and lock) open; the lock is released
// and the file closed here then.
func openBolt(path string, opts Options, fsync bool) (db *bolt.DB, err error) {
	timeout := opts.LockTimeout
	if timeout == 0 {
		// bbolt waits forever on 0; any positive timeout shorter than its
		// 50 ms retry fails after the first try.
		timeout = time.Nanosecond
	}
	var file *os.File
	bopts := &bolt.Options{
		Timeout: timeout,
		NoSync:  !fsync,
		OpenFile: func(name string, flag int, perm os.FileMode) (*os.File, error) {
			f, err := os.OpenFile(name, flag, perm)
			file = f
			return f, err
		},
	}
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if p := recover(); p != nil {
			if file != nil {
				// bbolt's mapping of the file keeps the open file alive
				// past Close, and the flock with it: unlock explicitly.
				// The mapping itself is lost until the process exits.
				unix.Flock(int(file.Fd()), unix.LOCK_UN)
				file.Close()
			}
			db, err = nil, &CorruptError{Path: path, Err: fmt.Errorf("bbolt: %v", p)}
		}
	}()
	db, err = bolt.Open(path, 0o600, bopts)
	switch {
	case err == nil:
		return db, nil
	case errors.Is(err, berrors.ErrTimeout):
		return nil, &LockedError{Path: path, PID: lockHolder(path)}
	case isAccess(err):
		return nil, &AccessError{Path: path, Err: err}
	case isNoSpace(err):
		return nil, &noSpace{fmt.Errorf("leases: create %s: %w", path, err)}
	case errors.Is(err, berrors.ErrInvalid), errors.Is(err, berrors.ErrChecksum),
		errors.Is(err, berrors.ErrVersionMismatch), strings.Contains(err.Error(), "file size too small"):
		// Bad meta pages, no page size to be found, a file too small to
		// be a bbolt file: what the file holds.
		return nil, &CorruptError{Path: path, Err: err}
	}
	// The rest is about where the file is (a missing directory) or the
	// system (mmap refused): not the file's fault.
	return nil, fmt.Errorf("leases: open %s: %w", path, err)
}

// wantFsync resolves mode for the file at path: SyncAuto fsyncs unless
// path's directory is on tmpfs or ramfs.
func wantFsync(path string, mode Sync) (bool, error) {
	switch mode {
	case SyncAlways:
		return true, nil
	case SyncNever:
		return false, nil
	case SyncAuto:
	default:
		return false, fmt.Errorf("%w: sync mode %d", ErrInvalid, mode)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(filepath.Dir(path), &st); err != nil {
		// Open reports a missing or unreadable directory better: fsync,
		// the safe choice, and let it.
		return true, nil
	}
	return !inMemory(st.Type), nil
}

// inMemory reports whether a filesystem of type fsType (statfs f_type)
// keeps its pages in memory only.
func inMemory(fsType int64) bool {
	return fsType == unix.TMPFS_MAGIC || fsType == unix.RAMFS_MAGIC
}

// MoveAside renames the store's file at path to path.corrupt-<UTC time>,
// and its journal, if it holds anything, to that name with JournalSuffix,
// for inspection, so that Open can start a new store. It refuses while a
// process holds the file (*LockedError), never replaces an existing file,
// and returns the new name.
//
// After a *CorruptError or *AccessError the records are gone for the
// daemon: it cannot tell the slots it finds leased from leaked, so its safe
// default is to touch none of them (quarantine and report) rather than
// reclaim them as it would with a readable store.
func MoveAside(path string) (string, error) {
	f, err := os.Open(path)
	switch {
	case err == nil:
		defer f.Close()
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); errors.Is(err, unix.EWOULDBLOCK) {
			return "", &LockedError{Path: path, PID: lockHolder(path)}
		} else if err != nil {
			return "", fmt.Errorf("leases: flock %s: %w", path, err)
		}
	case isAccess(err):
		// Unreadable: no process of ours can be using it either.
	default:
		return "", fmt.Errorf("leases: %w", err)
	}
	dst := path + corruptInfix + time.Now().UTC().Format(asideTime)
	if err := unix.Renameat2(unix.AT_FDCWD, path, unix.AT_FDCWD, dst, unix.RENAME_NOREPLACE); err != nil {
		return "", fmt.Errorf("leases: rename %s to %s: %w", path, dst, err)
	}
	// The journal goes with its file, named after the copy, unless it
	// holds nothing (the next Open starts it again).
	jpath := path + JournalSuffix
	if st, err := os.Stat(jpath); err == nil && st.Size() > 0 {
		if err := unix.Renameat2(unix.AT_FDCWD, jpath, unix.AT_FDCWD, dst+JournalSuffix, unix.RENAME_NOREPLACE); err != nil {
			return dst, fmt.Errorf("leases: rename %s to %s: %w", jpath, dst+JournalSuffix, err)
		}
	}
	if err := syncDir(filepath.Dir(path)); err != nil {
		return dst, fmt.Errorf("leases: %w", err)
	}
	return dst, nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", dir, err)
	}
	return nil
}

// lockHolder finds the pid holding a flock on path in /proc/locks, whose
// lines read "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF" (pid, then
// device major:minor in hex and inode). 0 when not found.
func lockHolder(path string) int {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0
	}
	want := fmt.Sprintf("%02x:%02x:%d", unix.Major(st.Dev), unix.Minor(st.Dev), st.Ino)
	f, err := os.Open("/proc/locks")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		// A waiter's line has "->" after the number; skip it.
		if len(fields) < 6 || fields[1] != "FLOCK" || fields[5] != want {
			continue
		}
		if pid, err := strconv.Atoi(fields[4]); err == nil && pid > 0 {
			return pid
		}
	}
	return 0
}
