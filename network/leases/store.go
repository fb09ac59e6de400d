package leases

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/phasegate/phasegate/internal/rootdir"
)

// Options configure Open. The zero value is usable.
type Options struct {
	// LockTimeout is how long Open waits for another process to let go of
	// the file. Zero means do not wait: fail at once with *LockedError.
	LockTimeout time.Duration
	// Sync says whether commits are fsynced; the zero value, SyncAuto,
	// decides by the file's filesystem.
	Sync Sync
}

// Sync is whether a commit is fsynced before the write returns. Either
// way a write returns only once its pages and its meta page are written
// to the file (pwrite, in that order), so the file is whole and holds it
// after the process dies at any instant, kill -9 included: the pages are
// in the kernel's page cache, which outlives the process. fsync adds the
// survival of a kernel crash or a power loss, which only a file on a disk
// can have.
type Sync uint8

const (
	// SyncAuto fsyncs unless the file is on tmpfs or ramfs, whose pages
	// are in memory only: there fsync is a no-op that costs two system
	// calls per commit, and the file dies at a reboot with the namespaces
	// it describes.
	SyncAuto Sync = iota
	// SyncAlways fsyncs every commit, wherever the file is.
	SyncAlways
	// SyncNever fsyncs no commit: a kernel crash or a power loss may leave
	// a file on a disk torn (Open then refuses it with *CorruptError).
	SyncNever
)

// Opened says what Open found.
type Opened struct {
	// Fresh: Open made the store, from no file or an empty one. A fresh
	// store next to slots on the host means their records are gone: the
	// caller cannot tell leased slots from leaked ones.
	Fresh bool
	// UpgradedFrom is the schema version the file had before Open upgraded
	// it; 0 when it was current (or Fresh).
	UpgradedFrom int
	// Backup is the copy of the file taken before that upgrade; "" if none.
	Backup string
	// Fsync: commits are fsynced (Options.Sync, and for SyncAuto the
	// file's filesystem).
	Fsync bool
	// Replayed is the number of changes read from the journal: writes
	// that had returned before the last process ended without writing
	// them into the file (a kill, a crash, a full filesystem at Close).
	Replayed int
	// OrphanJournal is where a journal found beside a fresh file (its own
	// file gone), or one that was not the file's, was moved; "" if none.
	OrphanJournal string
	// Generation names the store (16 hex digits), drawn when its file was
	// made: the journal's header carries it, and the daemon stamps it on
	// the slots it makes.
	Generation string
	// WasClosed: the last process that held the store closed it, every
	// change in the file. False after a kill, and for a fresh store.
	WasClosed bool
	// Unvouched: the store is new (Fresh now, or at an Open whose caller
	// did not call Vouched after): slots on the host may have been made
	// under records that are gone, which the caller checks, then calls
	// Vouched.
	Unvouched bool
	// JournalLoss is set when writes that had returned are not in the
	// store (its journal missing, emptied, cut or not its own, after a
	// process ended without closing it): found by this Open, or by an
	// earlier one and not cleared (ClearLoss). nil: nothing is known lost.
	JournalLoss *JournalLoss
}

// Store is the durable record of every slot: one bbolt file, opened by one
// process at a time. Its methods are safe for concurrent use. Writes return
// once their transaction is committed to the file (and fsynced, see Sync);
// concurrent writes share transactions (group commit).
type Store struct {
	path string
	// dir is the file's directory, name the file's name in it: every
	// file of the store is opened through dir, never through a link.
	dir  *rootdir.Dir
	name string
	// file is what bbolt opened (and closes).
	file   *os.File
	db     *bolt.DB
	opened Opened

	// life is held shared by every call and exclusively by Close, so Close
	// waits for calls under way and later calls see closed.
	life   sync.RWMutex
	closed bool

	mu      sync.Mutex // guards queue and leading
	queue   []*op
	leading bool
	// txs counts write groups run, appended or not (tests).
	txs atomic.Uint64

	// The journal (journal.go) and the changes it holds that the file
	// does not yet: the lead alone appends, merges and checkpoints, and
	// changes pending under pmu; readers hold pmu shared.
	jnl     *journal
	group   *changeSet // the lead's current group, reused
	pmu     sync.RWMutex
	pending *changeSet
	// appends counts entries appended; the checkpointer waits for it to
	// stand still. kick wakes the checkpointer after an append, full when
	// the journal holds maxPending changes.
	appends     atomic.Uint64
	checkpoints atomic.Uint64 // checkpoints committed (tests)
	kick, full  chan struct{}
	stopLoop    chan struct{}
	loopDone    chan struct{}
	stopOnce    sync.Once
}

// Path returns the store's file.
func (s *Store) Path() string { return s.path }

// Opened says what Open found: a fresh store, an upgrade and its backup.
func (s *Store) Opened() Opened { return s.opened }

// Close writes the journal's changes into the file and closes both, after
// the calls under way have returned, and lets go of the lock. Calls after
// Close return ErrClosed; Close again returns nil. When the changes cannot
// be written into the file (a full filesystem), Close still closes and
// says so: they stay in the journal, and the next Open reads them.
func (s *Store) Close() error {
	s.stopOnce.Do(func() {
		close(s.stopLoop)
		<-s.loopDone
	})
	s.life.Lock()
	defer s.life.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	var errs []error
	if err := s.checkpointClosed(); err != nil {
		errs = append(errs, fmt.Errorf("leases: %s: the journal's records stay in %s for the next Open: %w", s.path, s.jnl.path, err))
	}
	if err := s.jnl.close(); err != nil {
		errs = append(errs, err)
	}
	if err := s.db.Close(); err != nil {
		errs = append(errs, fmt.Errorf("leases: close %s: %w", s.path, err))
	}
	if err := s.dir.Close(); err != nil {
		errs = append(errs, fmt.Errorf("leases: close %s: %w", s.dir.Path(), err))
	}
	return errors.Join(errs...)
}

func (s *Store) enter() error {
	s.life.RLock()
	if s.closed {
		s.life.RUnlock()
		return ErrClosed
	}
	return nil
}

func (s *Store) leave() { s.life.RUnlock() }

// enterFor enters the store for a change asked under ctx: one whose ctx
// has ended changes nothing. The caller leaves as after enter.
func (s *Store) enterFor(ctx context.Context) error {
	if err := s.enter(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		s.leave()
		return err
	}
	return nil
}

// Get returns the record of slot index; ok is false when there is none.
func (s *Store) Get(index int) (rec Record, ok bool, err error) {
	if err := s.enter(); err != nil {
		return Record{}, false, err
	}
	defer s.leave()
	err = s.read(func(t *txn) error {
		rec, ok, err = s.get(t, index)
		return err
	})
	return rec, ok, err
}

func (s *Store) get(t *txn, index int) (Record, bool, error) {
	if err := checkIndex(index); err != nil {
		return Record{}, false, err
	}
	v := t.bucket(inSlots).Get(slotKey(index))
	if v == nil {
		return Record{}, false, nil
	}
	r, _, err := decode(index, v)
	if err != nil {
		return Record{}, false, &RecordsError{Path: s.path, Bad: map[int]error{index: err}}
	}
	return r, true, nil
}

// ByRequest returns the leased record that (owner, requestID) took, found
// through the request index in O(log n); ok is false when there is none. An
// empty requestID is never found: a request without an id is not
// idempotent.
func (s *Store) ByRequest(owner, requestID string) (rec Record, ok bool, err error) {
	if err := s.enter(); err != nil {
		return Record{}, false, err
	}
	defer s.leave()
	if owner == "" || requestID == "" {
		return Record{}, false, nil
	}
	err = s.read(func(t *txn) error {
		v := t.bucket(inRequests).Get(requestKey(owner, requestID))
		if v == nil {
			return nil
		}
		if len(v) != 4 {
			return &CorruptError{Path: s.path, Err: fmt.Errorf("request index entry for %q/%q is %d bytes, not 4", owner, requestID, len(v))}
		}
		i := int(binary.BigEndian.Uint32(v))
		rec, ok, err = s.get(t, i)
		if err == nil && (!ok || rec.Owner != owner || rec.RequestID != requestID) {
			return &CorruptError{Path: s.path, Err: fmt.Errorf("request index points %q/%q at slot %d, whose record does not hold it", owner, requestID, i)}
		}
		return err
	})
	return rec, ok, err
}

// Load returns every record, in index order. Records that cannot be read
// are left out and named in a *RecordsError, returned with the rest.
func (s *Store) Load() ([]Record, error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.leave()
	var (
		recs []Record
		bad  map[int]error
	)
	err := s.read(func(t *txn) error {
		return t.bucket(inSlots).ForEach(func(k, v []byte) error {
			i, err := parseSlotKey(k)
			if err != nil {
				return &CorruptError{Path: s.path, Err: err}
			}
			r, _, err := decode(i, v)
			if err != nil {
				if bad == nil {
					bad = map[int]error{}
				}
				bad[i] = err
				return nil
			}
			recs = append(recs, r)
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	// The journal's records come after the file's.
	slices.SortFunc(recs, func(a, b Record) int { return a.Index - b.Index })
	if bad != nil {
		return recs, &RecordsError{Path: s.path, Bad: bad}
	}
	return recs, nil
}

// Put stores recs atomically, each replacing the record of its index: all
// of them are committed (see Sync) when Put returns nil, none of them
// otherwise. Put replaces whole records: fields that a newer writer added
// are dropped (Update keeps them).
//
// ctx is consulted only before the write is queued. Once queued, Put waits
// for the commit, so that its result is always the truth: a
// caller never has to guess whether a record it was told failed is there.
//
// Put refuses, writing nothing: an invalid record (ErrInvalid), two
// records for one index or one request, and a request (Owner, RequestID)
// that another slot's record already holds (*DuplicateRequestError). A
// full filesystem fails it with an error matching ErrNoSpace.
func (s *Store) Put(ctx context.Context, recs ...Record) error {
	if err := s.enterFor(ctx); err != nil {
		return err
	}
	defer s.leave()
	if len(recs) == 0 {
		return nil
	}
	apply, err := putTx(recs)
	if err != nil {
		return err
	}
	return s.write(apply)
}

// putTx checks recs and returns the transaction body that stores them.
func putTx(recs []Record) (func(t *txn) error, error) {
	type prepared struct {
		index            int
		owner, requestID string
		key, val, reqKey []byte
	}
	ps := make([]prepared, len(recs))
	indices := make(map[int]bool, len(recs))
	reqs := make(map[string]int, len(recs))
	for n := range recs {
		r := &recs[n]
		if err := r.validate(); err != nil {
			return nil, err
		}
		if indices[r.Index] {
			return nil, fmt.Errorf("%w: slot %d given twice", ErrInvalid, r.Index)
		}
		indices[r.Index] = true
		rk := requestKeyOf(r)
		if rk != nil {
			if j, dup := reqs[string(rk)]; dup {
				return nil, fmt.Errorf("%w: request %q of owner %q given for slots %d and %d", ErrInvalid, r.RequestID, r.Owner, j, r.Index)
			}
			reqs[string(rk)] = r.Index
		}
		v, err := encode(r)
		if err != nil {
			return nil, fmt.Errorf("leases: encode slot %d: %w", r.Index, err)
		}
		ps[n] = prepared{index: r.Index, owner: r.Owner, requestID: r.RequestID, key: slotKey(r.Index), val: v, reqKey: rk}
	}
	return func(t *txn) error {
		slots, index := t.bucket(inSlots), t.bucket(inRequests)
		// Check every conflict before the first change, so that a refusal
		// leaves the transaction untouched.
		for _, p := range ps {
			if p.reqKey == nil {
				continue
			}
			if v := index.Get(p.reqKey); v != nil {
				holder := int(binary.BigEndian.Uint32(v))
				if holder != p.index && !indices[holder] {
					return reject(&DuplicateRequestError{Owner: p.owner, RequestID: p.requestID, Index: holder})
				}
			}
		}
		// Unindex what the replaced records held, then write.
		for _, p := range ps {
			if err := unindex(slots, index, p.key, p.reqKey); err != nil {
				return err
			}
		}
		for _, p := range ps {
			if err := slots.Put(p.key, p.val); err != nil {
				return err
			}
			if p.reqKey != nil {
				if err := index.Put(p.reqKey, p.key); err != nil {
					return err
				}
			}
		}
		return nil
	}, nil
}

// unindex removes the request index entry of the record stored under key,
// unless it is keep (the entry the new record keeps).
func unindex(slots, index bucketView, key, keep []byte) error {
	old := slots.Get(key)
	if old == nil {
		return nil
	}
	i, _ := parseSlotKey(key)
	r, _, err := decode(i, old)
	if err != nil {
		// An unreadable record is being replaced or removed: its index
		// entry, if any, cannot be found from it. It is found by value.
		return unindexValue(index, key)
	}
	if rk := requestKeyOf(&r); rk != nil && !bytes.Equal(rk, keep) {
		if v := index.Get(rk); bytes.Equal(v, key) {
			return index.Delete(rk)
		}
	}
	return nil
}

// unindexValue deletes every index entry pointing at key: O(n), only for
// records that no longer decode.
func unindexValue(index bucketView, key []byte) error {
	var stale [][]byte
	if err := index.ForEach(func(k, v []byte) error {
		if bytes.Equal(v, key) {
			stale = append(stale, slices.Clone(k))
		}
		return nil
	}); err != nil {
		return err
	}
	for _, k := range stale {
		if err := index.Delete(k); err != nil {
			return err
		}
	}
	return nil
}

// Delete removes the records of indices, atomically; an index without a
// record is not an error. ctx is consulted as by Put.
func (s *Store) Delete(ctx context.Context, indices ...int) error {
	if err := s.enterFor(ctx); err != nil {
		return err
	}
	defer s.leave()
	keys := make([][]byte, 0, len(indices))
	for _, i := range indices {
		if err := checkIndex(i); err != nil {
			return err
		}
		keys = append(keys, slotKey(i))
	}
	if len(keys) == 0 {
		return nil
	}
	return s.write(func(t *txn) error {
		slots, index := t.bucket(inSlots), t.bucket(inRequests)
		for _, k := range keys {
			if err := unindex(slots, index, k, nil); err != nil {
				return err
			}
			if err := slots.Delete(k); err != nil {
				return err
			}
		}
		return nil
	})
}

// Update reads the record of index, lets fn change it, and writes it back,
// in one transaction: a compare-and-set for KeepAlive and Release. fn gets
// a copy; if it returns an error, nothing is written and Update returns
// that error as it is; if it returns ErrRemove, the record is deleted. fn
// runs inside the commit and may run more than once (when a transaction it
// shares is retried), so it must do nothing but change the record: no side
// effects, no calls to the Store (they would deadlock). It must not change
// Index.
//
// Update returns the record as written (the zero Record when removed). It
// keeps fields a newer writer added that this build does not know. It
// refuses with ErrNotFound when index has no record, *RecordsError when
// that record cannot be read, and as Put for the record fn leaves.
func (s *Store) Update(ctx context.Context, index int, fn func(*Record) error) (Record, error) {
	if err := s.enterFor(ctx); err != nil {
		return Record{}, err
	}
	defer s.leave()
	if err := checkIndex(index); err != nil {
		return Record{}, err
	}
	key := slotKey(index)
	var out Record
	err := s.write(func(t *txn) error {
		slots, idx := t.bucket(inSlots), t.bucket(inRequests)
		v := slots.Get(key)
		if v == nil {
			return reject(fmt.Errorf("%w for slot %d", ErrNotFound, index))
		}
		old, msg, err := decode(index, v)
		if err != nil {
			return reject(&RecordsError{Path: s.path, Bad: map[int]error{index: err}})
		}
		r := old
		if err := callUpdate(fn, &r); errors.Is(err, ErrRemove) {
			out = Record{}
			if err := unindex(slots, idx, key, nil); err != nil {
				return err
			}
			return slots.Delete(key)
		} else if err != nil {
			return reject(err)
		}
		if r.Index != index {
			return reject(fmt.Errorf("%w: the update function changed slot %d's index to %d", ErrInvalid, index, r.Index))
		}
		if err := r.validate(); err != nil {
			return reject(err)
		}
		rk := requestKeyOf(&r)
		if rk != nil {
			if hv := idx.Get(rk); hv != nil && !bytes.Equal(hv, key) {
				return reject(&DuplicateRequestError{Owner: r.Owner, RequestID: r.RequestID, Index: int(binary.BigEndian.Uint32(hv))})
			}
		}
		fill(msg, &r) // keeps msg's unknown fields
		nv, err := marshal(msg)
		if err != nil {
			return reject(fmt.Errorf("leases: encode slot %d: %w", index, err))
		}
		if err := unindex(slots, idx, key, rk); err != nil {
			return err
		}
		if err := slots.Put(key, nv); err != nil {
			return err
		}
		if rk != nil {
			if err := idx.Put(rk, key); err != nil {
				return err
			}
		}
		out = r
		return nil
	})
	if err != nil {
		return Record{}, err
	}
	return out, nil
}

func callUpdate(fn func(*Record) error, r *Record) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("leases: update function panicked: %v", p)
		}
	}()
	return fn(r)
}
