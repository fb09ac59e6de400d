package leases

import (
	"bytes"
	"errors"
	"fmt"
	"runtime/debug"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// bucketID names a bucket whose keys the journal carries: the records and
// the request index. The meta bucket changes only at Open, in bbolt.
type bucketID uint8

const (
	inSlots bucketID = iota
	inRequests
	nBuckets
)

func (b bucketID) valid() bool { return b < nBuckets }

func (b bucketID) name() []byte {
	if b == inSlots {
		return bucketSlots
	}
	return bucketRequests
}

// change is a key's whole new value, or its removal.
type change struct {
	val []byte
	del bool
}

// changeSet is the latest change of each key it holds, per bucket: a
// group's changes, or the journal's since the last checkpoint.
type changeSet struct {
	buckets [nBuckets]map[string]change
}

func newChangeSet() *changeSet {
	c := &changeSet{}
	for b := range c.buckets {
		c.buckets[b] = map[string]change{}
	}
	return c
}

func (c *changeSet) put(b bucketID, k string, v []byte) { c.buckets[b][k] = change{val: v} }
func (c *changeSet) delete(b bucketID, k string)        { c.buckets[b][k] = change{del: true} }

// len is the number of keys changed.
func (c *changeSet) len() int {
	n := 0
	for _, m := range c.buckets {
		n += len(m)
	}
	return n
}

// merge takes every change of o, which wins over c's.
func (c *changeSet) merge(o *changeSet) {
	for b, m := range o.buckets {
		for k, ch := range m {
			c.buckets[b][k] = ch
		}
	}
}

// reset empties c. A map that grew large (a restore's Put of every lease,
// a checkpoint after a long burst) is let go rather than kept at its peak
// size for the life of the process.
func (c *changeSet) reset() {
	for b, m := range c.buckets {
		if len(m) > keepMapLen {
			c.buckets[b] = map[string]change{}
		} else {
			clear(m)
		}
	}
}

// keepMapLen is the largest change map reset keeps for reuse.
const keepMapLen = 1024

// applyTo writes c into bbolt's buckets.
func (c *changeSet) applyTo(tx *bolt.Tx) error {
	for b, m := range c.buckets {
		bk := tx.Bucket(bucketID(b).name())
		for k, ch := range m {
			var err error
			if ch.del {
				err = bk.Delete([]byte(k))
			} else {
				err = bk.Put([]byte(k), ch.val)
			}
			if err != nil {
				return fmt.Errorf("checkpoint %s/%x: %w", bucketID(b).name(), k, err)
			}
		}
	}
	return nil
}

// txn is what a write or a read sees: the file as of a bbolt read
// transaction, under the journal's changes not yet checkpointed
// (pending), under the changes a write group has made so far (group, nil
// for a read). Writes go into group; the leader appends it to the journal
// and merges it into pending once every op of the group has run.
type txn struct {
	tx      *bolt.Tx
	pending *changeSet
	group   *changeSet
}

// bucket returns b's view in t.
func (t *txn) bucket(b bucketID) bucketView { return bucketView{t: t, b: b, bk: t.tx.Bucket(b.name())} }

// bucketView is one bucket as a txn sees it, with bbolt's Get, Put, Delete and
// ForEach.
type bucketView struct {
	t  *txn
	b  bucketID
	bk *bolt.Bucket
}

// Get returns k's value, or nil. The bytes are valid for the txn's life.
func (v bucketView) Get(k []byte) []byte {
	if v.t.group != nil {
		if ch, ok := v.t.group.buckets[v.b][string(k)]; ok {
			return ch.live()
		}
	}
	if ch, ok := v.t.pending.buckets[v.b][string(k)]; ok {
		return ch.live()
	}
	return v.bk.Get(k)
}

func (ch change) live() []byte {
	if ch.del {
		return nil
	}
	return ch.val
}

// Put sets k to a copy of val in the group.
func (v bucketView) Put(k, val []byte) error {
	v.t.group.put(v.b, string(k), bytes.Clone(val))
	return nil
}

// Delete removes k in the group.
func (v bucketView) Delete(k []byte) error {
	v.t.group.delete(v.b, string(k))
	return nil
}

// ForEach calls fn for every live key, in no particular order.
func (v bucketView) ForEach(fn func(k, val []byte) error) error {
	over := map[string][]byte{}
	for _, c := range []*changeSet{v.t.pending, v.t.group} {
		if c == nil {
			continue
		}
		for k, ch := range c.buckets[v.b] {
			over[k] = ch.live()
		}
	}
	if err := v.bk.ForEach(func(k, val []byte) error {
		if _, ok := over[string(k)]; ok {
			return nil
		}
		return fn(k, val)
	}); err != nil {
		return err
	}
	for k, val := range over {
		if val != nil {
			if err := fn([]byte(k), val); err != nil {
				return err
			}
		}
	}
	return nil
}

// read runs fn over the records as they stand: the file under the
// journal's changes not yet checkpointed. Holding pmu shared for the whole
// read keeps the checkpoint from emptying pending between fn's look there
// and its look in the file.
func (s *Store) read(fn func(t *txn) error) error {
	s.pmu.RLock()
	defer s.pmu.RUnlock()
	return s.view(func(tx *bolt.Tx) error { return fn(&txn{tx: tx, pending: s.pending}) })
}

// view and update run a bbolt transaction with faults contained: a panic
// inside bbolt (a corrupt page) or a memory fault on the mapped file (a
// file truncated under us) becomes a *CorruptError instead of the end of
// the process, and a full filesystem an error matching ErrNoSpace.
func (s *Store) view(fn func(*bolt.Tx) error) error {
	return s.contain(func() error { return s.db.View(fn) })
}

func (s *Store) update(fn func(*bolt.Tx) error) error {
	return s.contain(func() error { return s.db.Update(fn) })
}

func (s *Store) contain(fn func() error) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if p := recover(); p != nil {
			err = &CorruptError{Path: s.path, Err: fmt.Errorf("bbolt: %v", p)}
		}
	}()
	return classify(s.path, fn())
}

func classify(path string, err error) error {
	var (
		ce *CorruptError
		r  *RecordsError
		d  *DuplicateRequestError
	)
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ce), errors.As(err, &r), errors.As(err, &d),
		errors.Is(err, ErrInvalid), errors.Is(err, ErrNotFound):
		return err
	case errors.Is(err, berrors.ErrDatabaseNotOpen):
		return ErrClosed
	case isNoSpace(err):
		return &noSpace{fmt.Errorf("leases: %s: %w", path, err)}
	}
	return fmt.Errorf("leases: %s: %w", path, err)
}
