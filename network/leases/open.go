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

	"github.com/phasegate/phasegate/internal/rootdir"
)

// Open opens the store at path, creating it (mode 0600) if there is no
// file; the directory must exist, and only root may control it: owned by
// root and writable by no one else, as every directory above it is (a
// sticky one aside; docs/SECURITY.md, "Files only root controls"). It
// takes the file's lock (see Options.LockTimeout), checks the whole file
// and upgrades an older schema. Every file in the directory, the store's and its journal's and
// the copies it makes, is opened relative to the directory's descriptor
// and never through a symbolic link.
//
// Open never panics on what it reads. Its typed errors: *LockedError (held
// by another process), *CorruptError (not a usable lease store: MoveAside
// it), *AccessError (cannot be read or written), *SchemaError (written by a
// newer build), an error matching ErrNoSpace (no room to create or
// upgrade it), and one matching syscall.ELOOP when the file or its journal
// is a symbolic link, which is refused, not followed. A file Open creates
// and cannot finish is removed again.
func Open(path string, opts Options) (*Store, error) {
	return open(path, opts, migrations)
}

func open(path string, opts Options, migs []migration) (*Store, error) {
	if opts.LockTimeout < 0 {
		return nil, fmt.Errorf("%w: negative lock timeout %v", ErrInvalid, opts.LockTimeout)
	}
	dir, err := rootdir.Open(filepath.Dir(path))
	if err != nil {
		return nil, fmt.Errorf("leases: %w", err)
	}
	s, err := openIn(dir, path, opts, migs)
	if err != nil {
		dir.Close()
	}
	return s, err
}

// openIn opens the store at path, whose directory is dir.
func openIn(dir *rootdir.Dir, path string, opts Options, migs []migration) (*Store, error) {
	name := filepath.Base(path)
	existed, empty := true, false
	switch st, err := dir.Stat(name); {
	case errors.Is(err, fs.ErrNotExist):
		existed = false
	case err != nil && isAccess(err):
		return nil, &AccessError{Path: path, Err: err}
	case err != nil:
		return nil, fmt.Errorf("leases: %w", err)
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return nil, &CorruptError{Path: path, Err: fmt.Errorf("not a regular file (%v)", fs.FileMode(st.Mode&unix.S_IFMT))}
	default:
		empty = st.Size == 0
	}
	// undo removes what a failed Open wrote into a file it made, or into an
	// empty one (which it treats as new).
	undo := func() {
		if !existed {
			dir.Remove(name)
		} else if empty {
			if f, err := dir.OpenFile(name, os.O_WRONLY|os.O_TRUNC, 0); err == nil {
				f.Close()
			}
		}
	}

	fsync, err := wantFsync(dir, opts.Sync)
	if err != nil {
		return nil, err
	}
	db, file, err := openBolt(dir, path, opts, fsync)
	if err != nil {
		var locked *LockedError
		if !errors.As(err, &locked) {
			undo()
		}
		return nil, err
	}
	s := &Store{path: path, dir: dir, name: name, file: file, db: db, opened: Opened{Fsync: fsync}}
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
		if err := dir.Sync(); err != nil {
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
// holds that the file does not, then records in the file that it is open
// (and a loss the journal shows). A fresh file's journal belongs to a
// file that is gone (removed, or moved aside without it): its changes
// would bring back a part of that file's records, so it is moved aside
// too, beside the file's own name with .orphan-<UTC time>, when it holds
// any (a header alone is a journal at rest: nothing to keep).
func (s *Store) openJournal() error {
	jname := s.name + JournalSuffix
	if s.opened.Fresh {
		st, err := s.dir.Stat(jname)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("leases: %w", err)
		}
		if err == nil && st.Size > headerLen {
			dst := jname + orphanInfix + time.Now().UTC().Format(asideTime)
			if err := s.dir.RenameNoReplace(jname, dst); err != nil {
				return fmt.Errorf("leases: the journal of a file that is gone: %w", err)
			}
			s.opened.OrphanJournal = s.dir.Join(dst)
		}
	}
	if err := s.readMeta(); err != nil {
		return err
	}
	s.pending, s.group = newChangeSet(), newChangeSet()
	trusted := s.opened.Fresh || s.opened.WasClosed
	j, found, err := openJournal(s.dir, jname, s.opened.Generation, s.opened.Fsync, trusted, s.pending)
	if err != nil {
		return err
	}
	s.jnl = j
	s.opened.Replayed += found.replayed
	if found.aside != "" {
		s.opened.OrphanJournal = found.aside
	}
	if err := s.noteOpen(found.loss); err != nil {
		j.close()
		return err
	}
	return nil
}

// openBolt runs bolt.Open with its faults contained: bbolt reads the meta
// and freelist pages while opening, and a damaged or missing page can make
// it panic or fault, leaving its file (and lock) open; the lock is released
// and the file closed here then. bbolt opens the file through dir, never
// through a link; the file it opened is returned too, for a check of what
// was opened rather than of the path.
func openBolt(dir *rootdir.Dir, path string, opts Options, fsync bool) (db *bolt.DB, file *os.File, err error) {
	timeout := opts.LockTimeout
	if timeout == 0 {
		// bbolt waits forever on 0; any positive timeout shorter than its
		// 50 ms retry fails after the first try.
		timeout = time.Nanosecond
	}
	name := filepath.Base(path)
	bopts := &bolt.Options{
		Timeout: timeout,
		NoSync:  !fsync,
		OpenFile: func(_ string, flag int, perm os.FileMode) (*os.File, error) {
			f, err := dir.OpenFile(name, flag, perm)
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
			db, file, err = nil, nil, &CorruptError{Path: path, Err: fmt.Errorf("bbolt: %v", p)}
		}
	}()
	db, err = bolt.Open(path, 0o600, bopts)
	switch {
	case err == nil:
		return db, file, nil
	case errors.Is(err, berrors.ErrTimeout):
		return nil, nil, &LockedError{Path: path, PID: lockHolder(dir, name)}
	case isAccess(err):
		return nil, nil, &AccessError{Path: path, Err: err}
	case isNoSpace(err):
		return nil, nil, &noSpace{fmt.Errorf("leases: create %s: %w", path, err)}
	case errors.Is(err, berrors.ErrInvalid), errors.Is(err, berrors.ErrChecksum),
		errors.Is(err, berrors.ErrVersionMismatch), strings.Contains(err.Error(), "file size too small"):
		// Bad meta pages, no page size to be found, a file too small to
		// be a bbolt file: what the file holds.
		return nil, nil, &CorruptError{Path: path, Err: err}
	}
	// The rest is about where the file is (a link, refused; a missing
	// directory) or the system (mmap refused): not the file's fault.
	return nil, nil, fmt.Errorf("leases: open %s: %w", path, err)
}

// wantFsync resolves mode for a file in dir: SyncAuto fsyncs unless dir
// is on tmpfs or ramfs.
func wantFsync(dir *rootdir.Dir, mode Sync) (bool, error) {
	switch mode {
	case SyncAlways:
		return true, nil
	case SyncNever:
		return false, nil
	case SyncAuto:
	default:
		return false, fmt.Errorf("%w: sync mode %d", ErrInvalid, mode)
	}
	st, err := dir.Statfs()
	if err != nil {
		// Open reports an unreadable directory better: fsync, the safe
		// choice, and let it.
		return true, nil
	}
	return !inMemory(st.Type), nil
}

// inMemory reports whether a filesystem of type fsType (statfs f_type)
// keeps its pages in memory only.
func inMemory(fsType int64) bool {
	return fsType == unix.TMPFS_MAGIC || fsType == unix.RAMFS_MAGIC
}

// lockHolder finds the pid holding a flock on name in dir in /proc/locks,
// whose lines read "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF" (pid,
// then device major:minor in hex and inode). 0 when not found.
func lockHolder(dir *rootdir.Dir, name string) int {
	st, err := dir.Stat(name)
	if err != nil {
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
