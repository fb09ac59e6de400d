package leases

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/internal/rootdir"
)

// What a store sets aside beside its path, for inspection, rather than
// open or remove: an unusable file (MoveAside, with its journal if that
// held anything) and a journal found beside a fresh file, whose own file
// is gone (Open). Each name ends with the UTC time it was set aside
// (asideTime), so that names sort by age.
const (
	corruptInfix = ".corrupt-"
	orphanInfix  = ".orphan-"
	asideTime    = "20060102T150405.000000000Z"
)

// Kept lists what was set aside beside a store's path, each list oldest
// first.
type Kept struct {
	// Copies are unusable files moved aside (path.corrupt-<time>).
	Copies []string
	// CopyJournals are the journals that went with them
	// (path.corrupt-<time>.journal).
	CopyJournals []string
	// Orphans are journals found beside a fresh file
	// (path.journal.orphan-<time>): the records they held are lost as
	// surely as a copy's.
	Orphans []string
}

// KeptAside lists what Open and MoveAside set aside beside path.
func KeptAside(path string) Kept {
	var k Kept
	// The patterns are valid (only a malformed one errs), and what cannot
	// be listed is as good as not there for a caller that only reports.
	copies, _ := filepath.Glob(path + corruptInfix + "*")
	for _, c := range copies {
		if strings.HasSuffix(c, JournalSuffix) {
			k.CopyJournals = append(k.CopyJournals, c)
		} else {
			k.Copies = append(k.Copies, c)
		}
	}
	k.Orphans, _ = filepath.Glob(path + JournalSuffix + orphanInfix + "*")
	slices.Sort(k.Copies)
	slices.Sort(k.CopyJournals)
	slices.Sort(k.Orphans)
	return k
}

// All is every name in k, for a caller that lists them for removal by
// hand.
func (k Kept) All() []string {
	return slices.Concat(k.Copies, k.CopyJournals, k.Orphans)
}

// MoveAside renames the store's file at path to path.corrupt-<UTC time>,
// and its journal, if it holds anything, to that name with JournalSuffix,
// for inspection, so that Open can start a new store. It refuses while a
// process holds the file (*LockedError), never replaces an existing file,
// follows no link (one is refused, as by Open), and returns the new name.
//
// After a *CorruptError or *AccessError the records are gone for the
// daemon: it cannot tell the slots it finds leased from leaked, so its safe
// default is to touch none of them (quarantine and report) rather than
// reclaim them as it would with a readable store.
func MoveAside(path string) (string, error) {
	dir, err := rootdir.Open(filepath.Dir(path))
	if err != nil {
		return "", fmt.Errorf("leases: %w", err)
	}
	defer dir.Close()
	name := filepath.Base(path)
	f, err := dir.OpenFile(name, os.O_RDONLY, 0)
	switch {
	case err == nil:
		defer f.Close()
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); errors.Is(err, unix.EWOULDBLOCK) {
			return "", &LockedError{Path: path, PID: lockHolder(dir, name)}
		} else if err != nil {
			return "", fmt.Errorf("leases: flock %s: %w", path, err)
		}
	case isAccess(err):
		// Unreadable: no process of ours can be using it either.
	default:
		return "", fmt.Errorf("leases: %w", err)
	}
	dst := name + corruptInfix + time.Now().UTC().Format(asideTime)
	if err := dir.RenameNoReplace(name, dst); err != nil {
		return "", fmt.Errorf("leases: %w", err)
	}
	// The journal goes with its file, named after the copy, unless it
	// holds nothing (the next Open starts it again).
	jname := name + JournalSuffix
	if st, err := dir.Stat(jname); err == nil && st.Size > 0 {
		if err := dir.RenameNoReplace(jname, dst+JournalSuffix); err != nil {
			return dir.Join(dst), fmt.Errorf("leases: %w", err)
		}
	}
	if err := dir.Sync(); err != nil {
		return dir.Join(dst), fmt.Errorf("leases: %w", err)
	}
	return dir.Join(dst), nil
}

// Remove removes the store at path for good: its file, its journal and
// the copies taken before schema upgrades, never through a link (a link of
// one of those names is removed itself). What was set aside for inspection
// (KeptAside) stays. It returns what it removed, the file and the journal
// always named. The caller must hold whatever keeps others from opening
// the store meanwhile (the daemon's lock).
func Remove(path string) ([]string, error) {
	dir, err := rootdir.Open(filepath.Dir(path))
	if err != nil {
		return nil, fmt.Errorf("leases: %w", err)
	}
	defer dir.Close()
	name := filepath.Base(path)
	all, err := dir.Names()
	if err != nil {
		return nil, fmt.Errorf("leases: %w", err)
	}
	names := []string{name, name + JournalSuffix}
	for _, n := range all {
		if isBackup(name, n) {
			names = append(names, n)
		}
	}
	var removed []string
	for _, n := range names {
		if err := dir.Remove(n); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return removed, fmt.Errorf("leases: %w", err)
		}
		removed = append(removed, dir.Join(n))
	}
	return removed, nil
}
