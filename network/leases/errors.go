package leases

import (
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strings"
	"syscall"
)

var (
	// ErrClosed is returned by every method of a closed Store (Close itself
	// excepted: it is idempotent).
	ErrClosed = errors.New("leases: store closed")

	// ErrNoSpace matches (errors.Is) a write that failed because the
	// filesystem or the user's quota is full. Nothing of that write was
	// applied; the store stays usable for reads, and for writes once space
	// is back. The same errors also match syscall.ENOSPC.
	ErrNoSpace = errors.New("leases: no space left for the store")

	// ErrRemove, returned by the function given to Update, deletes the
	// record (and its request index entry) in the same transaction; Update
	// then returns nil. It is a signal, like fs.SkipDir, not a failure.
	ErrRemove = errors.New("leases: remove the record")

	// ErrInvalid matches a Record, index or argument the store refuses
	// before it writes anything.
	ErrInvalid = errors.New("leases: invalid record")

	// ErrNotFound is returned by Update for an index without a record.
	ErrNotFound = errors.New("leases: no record")
)

// CorruptError says the file exists but is not a usable lease store: not a
// bbolt file, bbolt's consistency check fails, a page makes bbolt panic or
// fault, or its buckets are not this package's layout. The file is left as
// it was; MoveAside moves it out of the way for inspection.
type CorruptError struct {
	Path string
	Err  error
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("leases: %s is corrupt: %v", e.Path, e.Err)
}

func (e *CorruptError) Unwrap() error { return e.Err }

// AccessError says the file exists but this process may not read or write
// it (permissions, a read-only filesystem, a security module). It unwraps to
// the system error, so errors.Is(err, fs.ErrPermission) holds for EACCES and
// EPERM.
type AccessError struct {
	Path string
	Err  error
}

func (e *AccessError) Error() string {
	return fmt.Sprintf("leases: %s cannot be opened: %v", e.Path, e.Err)
}

func (e *AccessError) Unwrap() error { return e.Err }

// SchemaError says the file was written by a newer phasegate whose schema
// this build cannot read. Nothing was changed; run the newer binary, or move
// the file aside (and lose its records).
type SchemaError struct {
	Path      string
	Found     int // the file's schema version
	Supported int // the newest this build reads and writes (SchemaVersion)
}

func (e *SchemaError) Error() string {
	return fmt.Sprintf("leases: %s has schema version %d, newer than this build supports (%d): run the newer phasegate, or move the file aside",
		e.Path, e.Found, e.Supported)
}

// LockedError says another process holds the store's file (bbolt's flock)
// and did not let go within Options.LockTimeout.
type LockedError struct {
	Path string
	// PID of the holder as /proc/locks shows it, 0 when it could not be
	// found (another pid namespace, or the holder let go meanwhile).
	PID int
}

func (e *LockedError) Error() string {
	if e.PID > 0 {
		return fmt.Sprintf("leases: %s is held by another process (pid %d)", e.Path, e.PID)
	}
	return fmt.Sprintf("leases: %s is held by another process", e.Path)
}

// DuplicateRequestError is returned by Put and Update when a record's
// (Owner, RequestID) already belongs to another slot. A retried Acquire
// that raced with its first attempt lands here: Index is the slot the first
// attempt got, which the caller should return (and give its own back).
type DuplicateRequestError struct {
	Owner, RequestID string
	Index            int // the slot that holds the request
}

func (e *DuplicateRequestError) Error() string {
	return fmt.Sprintf("leases: request %q of owner %q already holds slot %d", e.RequestID, e.Owner, e.Index)
}

// RecordsError is returned by Load, beside every record that could be read,
// when some records could not: their bytes do not decode, or decode to
// something no writer of this schema writes (an unknown State). Get and
// Update return it for the one record they read. Such slots can be told
// neither leased nor idle: quarantine them, never reclaim or hand them out,
// until an operator decides (a Put or Delete of the index replaces the
// record).
type RecordsError struct {
	Path string
	Bad  map[int]error // by slot index
}

func (e *RecordsError) Error() string {
	idx := make([]int, 0, len(e.Bad))
	for i := range e.Bad {
		idx = append(idx, i)
	}
	sort.Ints(idx)
	var b strings.Builder
	fmt.Fprintf(&b, "leases: %s: %d unreadable record(s):", e.Path, len(idx))
	for n, i := range idx {
		if n == 5 {
			fmt.Fprintf(&b, " and %d more", len(idx)-n)
			break
		}
		fmt.Fprintf(&b, " slot %d (%v);", i, e.Bad[i])
	}
	return strings.TrimSuffix(b.String(), ";")
}

// noSpace wraps a write error caused by a full filesystem so that it matches
// both ErrNoSpace and syscall.ENOSPC. bbolt formats some of its errors with
// %s (growing the file), which loses the errno; isNoSpace recognises those
// by their text.
type noSpace struct{ err error }

func (e *noSpace) Error() string { return e.err.Error() }
func (e *noSpace) Unwrap() error { return e.err }
func (e *noSpace) Is(target error) bool {
	return target == ErrNoSpace || target == syscall.ENOSPC
}

func isNoSpace(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) ||
		strings.Contains(err.Error(), syscall.ENOSPC.Error()) ||
		strings.Contains(err.Error(), syscall.EDQUOT.Error())
}

func isAccess(err error) bool {
	return errors.Is(err, fs.ErrPermission) || errors.Is(err, syscall.EROFS)
}
