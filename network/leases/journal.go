package leases

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"

	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/internal/rootdir"
)

// The journal. Every committed group of writes is one entry appended to
// <path>.journal with one write(2) before any writer in the group returns
// (and fdatasync'd first where the store fsyncs); the changes are applied
// to the bbolt file later, many groups in one transaction (checkpoint), and
// the journal is then truncated. A returned write is therefore in the
// kernel's page cache, in the journal or in the file, which is what the
// records need (doc.go, "Writes"): the death of the process at any
// instant loses none of them.
//
// An entry is
//
//	uint32 payload length, uint32 CRC-32C of the payload (little endian)
//	payload: changes, each
//	  byte bucket, byte flags (1: delete), uvarint key length, key,
//	  uvarint value length, value (absent for a delete)
//
// Every change is the key's whole new value, so replaying an entry whose
// changes the file already holds (a kill between a checkpoint's commit and
// the truncation) changes nothing: replay is idempotent. Only the last
// entry can be torn (the writer was killed inside its write(2), or a power
// loss cut an entry no writer had been told of); Open drops it. A bad entry
// with more after it is damage, and Open refuses the store (*CorruptError
// naming the journal).

// JournalSuffix names a store's journal: <path>.journal beside its file.
// MoveAside takes it along, to <copy>.journal.
const JournalSuffix = ".journal"

// entryHeader is the length and checksum before every entry's payload.
const entryHeader = 8

// maxEntry bounds an entry's payload, so that a damaged length cannot make
// replay allocate without limit. A group is at most maxBatch ops, each at
// most a Put of a few records far smaller than this.
const maxEntry = 64 << 20

// maxKeptBuf is the largest entry buffer kept for the next append.
const maxKeptBuf = 64 << 10

// Change flags.
const flagDelete = 1

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// journal is the open journal file of a store. Only the writer holding the
// store's lead (commit.go) calls its methods, so it has no lock.
type journal struct {
	path  string
	f     *os.File
	size  int64 // the end of the last whole entry
	fsync bool
	// dirty: a failed append may have left a partial entry after size.
	dirty bool
	buf   []byte // reused entry buffer
}

// openJournal opens (or creates) the journal name in dir, never through a
// link, reads every whole entry into c, drops a torn last entry, and
// returns the journal ready to append, with the number of changes
// replayed.
func openJournal(dir *rootdir.Dir, name string, fsync bool, c *changeSet) (*journal, int, error) {
	path := dir.Join(name)
	f, err := dir.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o600)
	switch {
	case err != nil && isAccess(err):
		return nil, 0, &AccessError{Path: path, Err: err}
	case err != nil && isNoSpace(err):
		return nil, 0, &noSpace{fmt.Errorf("leases: create %s: %w", path, err)}
	case err != nil:
		return nil, 0, fmt.Errorf("leases: open %s: %w", path, err)
	}
	j := &journal{path: path, f: f, fsync: fsync}
	n, err := j.replay(c)
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	return j, n, nil
}

// replay reads the journal's entries into c, in order, and truncates a torn
// last entry away.
func (j *journal) replay(c *changeSet) (int, error) {
	st, err := j.f.Stat()
	if err != nil {
		return 0, fmt.Errorf("leases: stat %s: %w", j.path, err)
	}
	if !st.Mode().IsRegular() {
		return 0, &CorruptError{Path: j.path, Err: fmt.Errorf("not a regular file (%v)", st.Mode().Type())}
	}
	data := make([]byte, st.Size())
	if _, err := io.ReadFull(io.NewSectionReader(j.f, 0, st.Size()), data); err != nil {
		return 0, fmt.Errorf("leases: read %s: %w", j.path, err)
	}
	var off, changes int
	for off < len(data) {
		payload, torn, err := entryAt(data, off)
		if torn {
			// The last write was cut: no writer was told of it.
			if err := j.f.Truncate(int64(off)); err != nil {
				return 0, fmt.Errorf("leases: truncate %s to its last whole entry (%d bytes): %w", j.path, off, err)
			}
			break
		}
		if err == nil {
			var n int
			n, err = decodeEntry(payload, c)
			changes += n
		}
		if err != nil {
			return 0, &CorruptError{Path: j.path, Err: fmt.Errorf("entry at offset %d: %w", off, err)}
		}
		off += entryHeader + len(payload)
	}
	j.size = int64(off)
	return changes, nil
}

// entryAt returns the payload of the entry at off. torn says the entry is
// cut short or damaged with nothing after it: what a write cut by a kill
// or a power loss leaves, to be dropped. Any other damage is an error.
func entryAt(data []byte, off int) (payload []byte, torn bool, err error) {
	rest := data[off:]
	if len(rest) < entryHeader {
		return nil, true, nil
	}
	n := binary.LittleEndian.Uint32(rest)
	if n > maxEntry {
		return nil, false, fmt.Errorf("length %d beyond the largest entry (%d)", n, maxEntry)
	}
	end := entryHeader + int(n)
	if end > len(rest) {
		return nil, true, nil
	}
	payload = rest[entryHeader:end]
	if crc32.Checksum(payload, castagnoli) != binary.LittleEndian.Uint32(rest[4:]) {
		if end == len(rest) {
			return nil, true, nil
		}
		return nil, false, errors.New("checksum mismatch")
	}
	return payload, false, nil
}

// decodeEntry applies an entry's changes to c, returning how many.
func decodeEntry(p []byte, c *changeSet) (int, error) {
	n := 0
	for len(p) > 0 {
		if len(p) < 2 {
			return n, errors.New("change cut short")
		}
		b, flags := bucketID(p[0]), p[1]
		if !b.valid() || flags&^flagDelete != 0 {
			return n, fmt.Errorf("change %d: bucket %d, flags %#x: not written by this build", n, b, flags)
		}
		p = p[2:]
		key, rest, err := uvarintBytes(p)
		if err != nil {
			return n, fmt.Errorf("change %d: key: %w", n, err)
		}
		p = rest
		if flags&flagDelete != 0 {
			c.delete(b, string(key))
		} else {
			var val []byte
			if val, p, err = uvarintBytes(p); err != nil {
				return n, fmt.Errorf("change %d: value: %w", n, err)
			}
			c.put(b, string(key), append([]byte(nil), val...))
		}
		n++
	}
	return n, nil
}

// uvarintBytes reads a length-prefixed byte string.
func uvarintBytes(p []byte) (b, rest []byte, err error) {
	n, k := binary.Uvarint(p)
	if k <= 0 || n > uint64(len(p)-k) {
		return nil, nil, errors.New("length beyond the entry")
	}
	return p[k : k+int(n)], p[k+int(n):], nil
}

// append writes c as one entry and returns once it is in the file (and
// fdatasync'd, where the store fsyncs). A failed append leaves the file as
// it was: a partial write is truncated away, so that the next entry does
// not follow a torn one.
func (j *journal) append(c *changeSet) error {
	buf := append(j.buf[:0], make([]byte, entryHeader)...)
	for b := range c.buckets {
		for k, ch := range c.buckets[b] {
			var flags byte
			if ch.del {
				flags = flagDelete
			}
			buf = append(buf, byte(b), flags)
			buf = binary.AppendUvarint(buf, uint64(len(k)))
			buf = append(buf, k...)
			if !ch.del {
				buf = binary.AppendUvarint(buf, uint64(len(ch.val)))
				buf = append(buf, ch.val...)
			}
		}
	}
	payload := buf[entryHeader:]
	binary.LittleEndian.PutUint32(buf, uint32(len(payload)))
	binary.LittleEndian.PutUint32(buf[4:], crc32.Checksum(payload, castagnoli))
	if cap(buf) <= maxKeptBuf {
		j.buf = buf
	} else {
		j.buf = nil // one large group's buffer is not kept for the small ones
	}
	if err := j.repair(); err != nil {
		return err
	}
	if _, err := j.f.Write(buf); err != nil {
		j.dirty = true
		_ = j.repair() // if it fails, the next append tries again first
		return classify(j.path, fmt.Errorf("append: %w", err))
	}
	if j.fsync {
		if err := unix.Fdatasync(int(j.f.Fd())); err != nil {
			// The entry may or may not be on the disk; its writers are
			// told it failed, so it must not replay either.
			j.dirty = true
			_ = j.repair()
			return classify(j.path, fmt.Errorf("fdatasync: %w", err))
		}
	}
	j.size += int64(len(buf))
	return nil
}

// repair truncates whatever follows the last whole entry (a failed
// append's partial write).
func (j *journal) repair() error {
	if !j.dirty {
		return nil
	}
	if err := j.f.Truncate(j.size); err != nil {
		return fmt.Errorf("leases: truncate %s after a failed append: %w", j.path, err)
	}
	j.dirty = false
	return nil
}

// reset empties the journal once its changes are in the file.
func (j *journal) reset() error {
	if err := j.f.Truncate(0); err != nil {
		return fmt.Errorf("leases: truncate %s: %w", j.path, err)
	}
	j.size, j.dirty = 0, false
	return nil
}

// close closes the journal file.
func (j *journal) close() error {
	if err := j.f.Close(); err != nil && !errors.Is(err, fs.ErrClosed) {
		return fmt.Errorf("leases: close %s: %w", j.path, err)
	}
	return nil
}
