package leases

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// JournalLoss says that writes which had returned to their callers are
// not in the store: its journal was found missing, emptied, cut short of
// how far it reached, or not this store's, after a process that held the
// store ended without closing it. The records as they stand miss those
// writes (a lease taken, renewed or ended): the caller cannot tell from
// them which slots are leased, and must treat every slot without a lease
// record as possibly somebody's (doc.go, "Faults").
//
// Open records a loss in the file (meta/lost) before it returns, so that
// a start killed before it dealt with the loss finds it again; ClearLoss
// forgets it once the caller has (the daemon, once it has held the slots
// something lives in).
type JournalLoss struct {
	// Path is the journal's.
	Path string `json:"path"`
	// Reason says what was found, in words.
	Reason string `json:"reason"`
	// At is when an Open found it.
	At time.Time `json:"at"`
	// Named are the changes a torn entry still held whole: the slots the
	// lost writes were about, with the owner and request id of a lease
	// where the record was whole. Empty when nothing of them is left.
	Named []LostChange `json:"named,omitempty"`
}

// LostChange is one change of a lost journal entry, as far as its bytes
// still tell it.
type LostChange struct {
	Index int `json:"index"`
	// Removed: the change deleted the slot's record (a lease ended).
	Removed bool `json:"removed,omitempty"`
	// State, Owner and RequestID are the record's, when its value was
	// whole; a request index change names Owner and RequestID alone.
	State     State  `json:"state,omitempty"`
	Owner     string `json:"owner,omitempty"`
	RequestID string `json:"request_id,omitempty"`
}

// In meta, besides the schema keys. Values are ASCII (lost is JSON).
var (
	// keyGeneration names the store: 16 hex digits drawn when the file is
	// made (or upgraded to schema 7). The journal's header carries it, so
	// that a journal is never read into another store, and the daemon
	// stamps it on the slots it makes (DESIGN.md section 6), so that a
	// slot made under records that are gone is told from one made by
	// something that kept none.
	keyGeneration = []byte("generation")
	// keyClosed is set, to the RFC 3339 time, by Close once every change
	// is in the file, and removed by Open before the first append: a
	// journal missing or emptied while it is set loses nothing.
	keyClosed = []byte("closed")
	// keyLost holds the JournalLoss an Open found (JSON), until
	// ClearLoss.
	keyLost = []byte("lost")
	// keyUnvouched is set, to the RFC 3339 time, when the file is made,
	// and removed by Vouched: until then the slots on the host may have
	// been made under records that are gone, which the daemon checks.
	keyUnvouched = []byte("unvouched")
)

// newGeneration draws a store's generation.
func newGeneration() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// validGeneration reports whether g is 16 lowercase hex digits.
func validGeneration(g []byte) bool {
	if len(g) != 16 {
		return false
	}
	_, err := hex.DecodeString(string(g))
	return err == nil
}

// readMeta reads the generation, whether the file was closed, and a loss
// recorded by an earlier Open.
func (s *Store) readMeta() error {
	return s.view(func(tx *bolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		g := meta.Get(keyGeneration)
		if !validGeneration(g) {
			return &CorruptError{Path: s.path, Err: fmt.Errorf("meta/%s %q is not 16 hex digits", keyGeneration, g)}
		}
		s.opened.Generation = string(g)
		s.opened.WasClosed = meta.Get(keyClosed) != nil
		s.opened.Unvouched = meta.Get(keyUnvouched) != nil
		if v := meta.Get(keyLost); v != nil {
			var l JournalLoss
			if err := json.Unmarshal(v, &l); err != nil {
				return &CorruptError{Path: s.path, Err: fmt.Errorf("meta/%s: %w", keyLost, err)}
			}
			s.opened.JournalLoss = &l
		}
		return nil
	})
}

// noteOpen is Open's one write to meta once the journal is read: the
// file is no longer closed (a kill from now on may leave writes in the
// journal alone), and a loss found is recorded. A loss recorded earlier
// and not cleared stays, its reason joined with the new one's.
func (s *Store) noteOpen(loss *JournalLoss) error {
	if loss == nil && !s.opened.WasClosed {
		return nil
	}
	if loss != nil {
		loss.At = time.Now().UTC()
		if prev := s.opened.JournalLoss; prev != nil {
			loss.Reason = prev.Reason + "; then " + loss.Reason
			loss.Named = append(prev.Named, loss.Named...)
			loss.At = prev.At
		}
		s.opened.JournalLoss = loss
	}
	return s.update(func(tx *bolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		if err := meta.Delete(keyClosed); err != nil {
			return err
		}
		if loss == nil {
			return nil
		}
		b, err := json.Marshal(loss)
		if err != nil {
			return err
		}
		return meta.Put(keyLost, b)
	})
}

// ClearLoss forgets the journal loss Open reported (Opened.JournalLoss),
// once the caller has dealt with it: the next Open reports none unless it
// finds one. The daemon calls it once the slots the lost writes may have
// leased are held, recorded as such.
func (s *Store) ClearLoss(ctx context.Context) error {
	// The records the caller wrote first are in the journal already
	// (their writes returned): a kill after this commit replays them.
	return s.forget(ctx, keyLost)
}

// Vouched records that the caller has checked the slots on the host
// against records other than these (Opened.Unvouched): the next Open
// reports the store vouched for.
func (s *Store) Vouched(ctx context.Context) error {
	return s.forget(ctx, keyUnvouched)
}

// forget deletes key from the file's meta, in a transaction of its own.
func (s *Store) forget(ctx context.Context, key []byte) error {
	if err := s.enterFor(ctx); err != nil {
		return err
	}
	defer s.leave()
	return s.update(func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Delete(key) })
}

// markClosed records in tx that every change is in the file: in Close's
// checkpoint, and in an upgrade that wrote the older journal into the
// file.
func markClosed(tx *bolt.Tx) error {
	return tx.Bucket(bucketMeta).Put(keyClosed, []byte(time.Now().UTC().Format(time.RFC3339Nano)))
}
