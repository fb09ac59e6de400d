package leases

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"strings"
	"time"

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
// loss cut an entry no writer had been told of); Open drops it when it lies
// past the header's reach, and reports a loss (JournalLoss) when the
// journal ends short of its reach. A bad entry with more after it is
// damage, and Open refuses the store (*CorruptError naming the journal).

// JournalSuffix names a store's journal: <path>.journal beside its file.
// MoveAside takes it along, to <copy>.journal.
const JournalSuffix = ".journal"

// The journal's header (schema 7), its first headerLen bytes:
//
//	magic "pgjourn\x02", the store's generation (16 ASCII hex digits, as
//	meta/generation), reach (uint64: the end of the last entry whose
//	writers were told), CRC-32C of the 32 bytes before it (little endian)
//
// reach is how far the journal reached: rewritten in place after every
// append, once the entry is in the file (and fdatasync'd where the store
// fsyncs), before its writers return, and set back to headerLen by a
// checkpoint. A journal shorter than its reach was cut after writes were
// told: a detected loss, never a silent one (Opened.JournalLoss). A torn
// entry past reach is what a kill inside its write(2) leaves, which no
// writer was told of; Open drops it.
const (
	headerLen   = 36
	journalMark = "pgjourn\x02"
)

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
	gen   string // the store's generation, in the header
	size  int64  // the end of the last whole entry
	fsync bool
	// dirty: a failed append may have left a partial entry after size.
	dirty bool
	buf   []byte // reused entry buffer
	hdr   [headerLen]byte
}

// journalFound is what openJournal found besides the changes: how much it
// replayed, and what it could not.
type journalFound struct {
	replayed int
	// loss is set when writes that were told are not in the journal.
	loss *JournalLoss
	// aside is where a journal that is not this store's was moved.
	aside string
}

// openJournal opens the journal name in dir, never through a link, for
// the store of generation gen, and reads every whole entry into c. trusted
// says the file holds every change already (a new store, or one its last
// holder closed): then whatever the journal holds, or its absence, loses
// nothing, and it is started again. Otherwise a journal missing, without
// its header, or cut short of its reach is a loss, reported in the
// result: the whole entries it still holds are replayed, and it goes on
// from its last whole entry. A journal with another store's header, or
// bytes that are no header, is moved aside (.orphan-<time>) for
// inspection.
func openJournal(dir *rootdir.Dir, name, gen string, fsync, trusted bool, c *changeSet) (*journal, journalFound, error) {
	path := dir.Join(name)
	var found journalFound
	f, err := dir.OpenFile(name, os.O_RDWR, 0)
	if errors.Is(err, fs.ErrNotExist) {
		if !trusted {
			found.loss = &JournalLoss{Path: path, Reason: "the journal is missing"}
		}
		f, err = dir.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	}
	switch {
	case err != nil && isAccess(err):
		return nil, found, &AccessError{Path: path, Err: err}
	case err != nil && isNoSpace(err):
		return nil, found, &noSpace{fmt.Errorf("leases: create %s: %w", path, err)}
	case err != nil:
		return nil, found, fmt.Errorf("leases: open %s: %w", path, err)
	}
	j := &journal{path: path, f: f, gen: gen, fsync: fsync}
	if err := j.load(dir, name, trusted, c, &found); err != nil {
		j.f.Close() // load may have replaced f with a journal it made
		return nil, found, err
	}
	return j, found, nil
}

// load reads the open journal: its header, then its entries into c.
func (j *journal) load(dir *rootdir.Dir, name string, trusted bool, c *changeSet, found *journalFound) error {
	data, err := j.read()
	if err != nil {
		return err
	}
	if trusted {
		// Everything is in the file: whatever the journal holds is there
		// too (or not this store's, and no loss of its).
		return j.reset()
	}
	hgen, reach, ok := parseHeader(data)
	switch {
	case ok && hgen == j.gen:
		n, end, loss, err := replay(data, headerLen, int64(reach), c)
		if err != nil {
			return &CorruptError{Path: j.path, Err: err}
		}
		found.replayed = n
		if loss != nil {
			loss.Path = j.path
			found.loss = loss
		}
		if int64(len(data)) > end {
			// A torn entry past reach, or the cut remains of one before it.
			if err := j.f.Truncate(end); err != nil {
				return fmt.Errorf("leases: truncate %s to its last whole entry (%d bytes): %w", j.path, end, err)
			}
		}
		j.size = end
		return j.writeHeader()
	case len(data) < headerLen && (len(data) == 0 || strings.HasPrefix(journalMark, string(data[:min(len(data), len(journalMark))]))):
		// Emptied, or cut inside its header: nothing to keep aside.
		if found.loss == nil {
			found.loss = &JournalLoss{Path: j.path, Reason: fmt.Sprintf("the journal was emptied (%d bytes, without its header)", len(data))}
		}
		return j.reset()
	}
	// Another store's journal, or bytes that are none: keep them for
	// inspection, and start a journal of this store's own.
	dst := name + orphanInfix + time.Now().UTC().Format(asideTime)
	if err := dir.RenameNoReplace(name, dst); err != nil {
		return fmt.Errorf("leases: set aside %s (not this store's journal): %w", j.path, err)
	}
	found.aside = dir.Join(dst)
	why := "another store's journal (generation " + hgen + ")"
	if !ok {
		why = "no journal header"
	}
	found.loss = &JournalLoss{Path: j.path, Reason: fmt.Sprintf("the journal was not this store's (%s): moved to %s", why, found.aside)}
	f, err := dir.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("leases: create %s: %w", j.path, err)
	}
	j.f.Close()
	j.f = f
	return j.reset()
}

// read returns the journal's bytes.
func (j *journal) read() ([]byte, error) {
	st, err := j.f.Stat()
	if err != nil {
		return nil, fmt.Errorf("leases: stat %s: %w", j.path, err)
	}
	if !st.Mode().IsRegular() {
		return nil, &CorruptError{Path: j.path, Err: fmt.Errorf("not a regular file (%v)", st.Mode().Type())}
	}
	data := make([]byte, st.Size())
	if _, err := io.ReadFull(io.NewSectionReader(j.f, 0, st.Size()), data); err != nil {
		return nil, fmt.Errorf("leases: read %s: %w", j.path, err)
	}
	return data, nil
}

// parseHeader reads a journal's header: the generation and reach, ok
// false when data does not start with a whole, valid one.
func parseHeader(data []byte) (gen string, reach uint64, ok bool) {
	if len(data) < headerLen || string(data[:len(journalMark)]) != journalMark ||
		crc32.Checksum(data[:headerLen-4], castagnoli) != binary.LittleEndian.Uint32(data[headerLen-4:]) {
		return "", 0, false
	}
	reach = binary.LittleEndian.Uint64(data[24:])
	return string(data[8:24]), reach, reach >= headerLen
}

// writeHeader writes the header with reach at size, in place: what a
// kill leaves is the old header or the new one (a 36-byte write within a
// page is copied whole or not at all).
func (j *journal) writeHeader() error {
	h := j.hdr[:0]
	h = append(h, journalMark...)
	h = append(h, j.gen...)
	h = binary.LittleEndian.AppendUint64(h, uint64(j.size))
	h = binary.LittleEndian.AppendUint32(h, crc32.Checksum(h, castagnoli))
	if _, err := j.f.WriteAt(h, 0); err != nil {
		return classify(j.path, fmt.Errorf("write the journal's header: %w", err))
	}
	return nil
}

// replay reads the entries of data from off into c, in order, and returns
// how many changes it read and the end of the last whole entry. An entry
// cut or damaged with nothing after it is torn: past reach, no writer was
// told of it and it is dropped; before reach, writes that were told are
// lost, and loss names what the cut entry still holds whole. Any other
// damage is an error.
func replay(data []byte, off int, reach int64, c *changeSet) (changes int, end int64, loss *JournalLoss, err error) {
	for off < len(data) {
		payload, torn, err := entryAt(data, off)
		if torn {
			if int64(off) < reach {
				loss = &JournalLoss{Reason: fmt.Sprintf("the journal was cut at %d bytes of the %d it reached: its entry at offset %d is torn", len(data), reach, off),
					Named: tornNames(data[off:])}
			}
			return changes, int64(off), loss, nil
		}
		if err == nil {
			var n int
			n, err = decodeEntry(payload, c)
			changes += n
		}
		if err != nil {
			return 0, 0, nil, fmt.Errorf("entry at offset %d: %w", off, err)
		}
		off += entryHeader + len(payload)
	}
	if int64(off) < reach {
		loss = &JournalLoss{Reason: fmt.Sprintf("the journal was cut at %d bytes of the %d it reached, after its entry ending there", off, reach)}
	}
	return changes, int64(off), loss, nil
}

// tornNames returns what the torn entry at the start of b still holds
// whole: each slot it changed, with the record's owner and request id
// where its value is whole, and each request it indexed.
func tornNames(b []byte) []LostChange {
	if len(b) <= entryHeader {
		return nil
	}
	n := int(binary.LittleEndian.Uint32(b))
	p := b[entryHeader:]
	if n < len(p) {
		p = p[:n]
	}
	var out []LostChange
	for len(p) >= 2 {
		bk, flags := bucketID(p[0]), p[1]
		key, rest, err := uvarintBytes(p[2:])
		if err != nil || !bk.valid() {
			break
		}
		p = rest
		var val []byte
		if flags&flagDelete == 0 {
			if val, p, err = uvarintBytes(p); err != nil {
				val = nil
			}
		}
		switch bk {
		case inSlots:
			i, kerr := parseSlotKey(key)
			if kerr != nil {
				break
			}
			lc := LostChange{Index: i, Removed: flags&flagDelete != 0}
			if r, _, derr := decode(i, val); val != nil && derr == nil {
				lc.State, lc.Owner, lc.RequestID = r.State, r.Owner, r.RequestID
			}
			out = append(out, lc)
		case inRequests:
			if len(key) >= 2 && len(val) == 4 {
				ol := int(binary.BigEndian.Uint16(key))
				if 2+ol <= len(key) {
					out = append(out, LostChange{Index: int(binary.BigEndian.Uint32(val)), Owner: string(key[2 : 2+ol]), RequestID: string(key[2+ol:])})
				}
			}
		}
		if err != nil {
			break
		}
	}
	return out
}

// readLegacy reads the entries of a journal written before schema 7
// (without a header) into c, dropping a torn last one as builds of that
// schema did.
func readLegacy(dir *rootdir.Dir, name string, c *changeSet) error {
	f, err := dir.OpenFile(name, os.O_RDONLY, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("leases: open %s: %w", dir.Join(name), err)
	}
	defer f.Close()
	j := &journal{path: dir.Join(name), f: f}
	data, err := j.read()
	if err != nil {
		return err
	}
	if _, _, _, err := replay(data, 0, 0, c); err != nil {
		return &CorruptError{Path: j.path, Err: err}
	}
	return nil
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
// fdatasync'd, where the store fsyncs) and the header's reach says so. A
// failed append leaves the file as it was: a partial write is truncated
// away, so that the next entry does not follow a torn one. The header is
// written after the entry, and not fdatasync'd itself: after a power loss
// it may say less than the journal holds (the entries past it replay all
// the same), never more, since the next entry's fdatasync carries it.
func (j *journal) append(c *changeSet) error {
	buf := encodeEntry(j.buf[:0], c)
	if cap(buf) <= maxKeptBuf {
		j.buf = buf
	} else {
		j.buf = nil // one large group's buffer is not kept for the small ones
	}
	if err := j.repair(); err != nil {
		return err
	}
	if _, err := j.f.WriteAt(buf, j.size); err != nil {
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
	// The entry is whole: a later Open replays it, so its writers must
	// not be told it failed if the header cannot say so; only a cut of
	// the journal goes unseen until a header write succeeds.
	_ = j.writeHeader()
	return nil
}

// encodeEntry appends c to buf as one entry.
func encodeEntry(buf []byte, c *changeSet) []byte {
	buf = append(buf, make([]byte, entryHeader)...)
	start := len(buf) - entryHeader
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
	payload := buf[start+entryHeader:]
	binary.LittleEndian.PutUint32(buf[start:], uint32(len(payload)))
	binary.LittleEndian.PutUint32(buf[start+4:], crc32.Checksum(payload, castagnoli))
	return buf
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

// reset empties the journal once its changes are in the file: its header
// says so first, so that a kill before the truncation leaves whole entries
// past reach, which replay harmlessly.
func (j *journal) reset() error {
	j.size = headerLen
	if err := j.writeHeader(); err != nil {
		return err
	}
	if err := j.f.Truncate(headerLen); err != nil {
		return fmt.Errorf("leases: truncate %s: %w", j.path, err)
	}
	j.dirty = false
	return nil
}

// close closes the journal file.
func (j *journal) close() error {
	if err := j.f.Close(); err != nil && !errors.Is(err, fs.ErrClosed) {
		return fmt.Errorf("leases: close %s: %w", j.path, err)
	}
	return nil
}
