package leases

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/proto"

	"github.com/phasegate/phasegate/network/leases/internal/recordpb"
)

// SchemaVersion is the layout this build reads and writes. Open upgrades a
// file of an older layout and refuses a newer one (*SchemaError).
//
//	1  meta{schema, created}, slots{index -> record}
//	2  adds requests{owner, request id -> index}, built from slots on upgrade
//	3  a leased record names its principal; those recorded before are root's
//	4  records may also be in the journal beside the file (journal.go),
//	   which a build that does not read it must not open without
//	5  a certificate's principal names the kind of its identity; those
//	   recorded before are read as LegacyCertificate ones
//	6  a lease may be an attachment (its slot's inside end in a namespace
//	   the daemon does not own), which a build that does not know it would
//	   "repair" by putting an inside end back into the slot's namespace
//	7  a slot may be held (State Held); meta names the store's generation
//	   and whether its last holder closed it; the journal starts with a
//	   header (the generation, how far it reached), which a build that
//	   does not know it would read as a damaged entry
const SchemaVersion = 7

var (
	bucketMeta     = []byte("meta")
	bucketSlots    = []byte("slots")
	bucketRequests = []byte("requests")

	// In meta. Values are plain ASCII, readable with bbolt's command line
	// tool, and independent of the record encoding.
	keySchema   = []byte("schema")   // decimal version
	keyCreated  = []byte("created")  // RFC 3339, when the file was made
	keyUpgraded = []byte("upgraded") // "<from> -> <to> at <RFC 3339>", the last upgrade
)

// migration upgrades a file from schema to-1 to schema to, inside the one
// transaction that runs every step needed and then writes the new version:
// either the file reaches SchemaVersion or it is left as it was.
type migration struct {
	to   int
	what string
	run  func(tx *bolt.Tx) error
}

// migrations, in order; the last one's to is SchemaVersion. A migration
// must be tested with a file of the layout it starts from. Migrations run
// at Open before the journal is read: one from schema 4 on that changes
// records must first write the journal's changes into the file.
var migrations = []migration{
	{to: 2, what: "build the request index", run: buildRequestIndex},
	{to: 3, what: "name the principal of earlier leases", run: nameLegacyPrincipals},
	{to: 4, what: "keep writes in a journal beside the file", run: func(*bolt.Tx) error { return nil }},
	// Records are read as they are: those of the file and of its journal
	// written before are told apart by principal_kinds (fromMessage).
	{to: 5, what: "certificate principals name their kind", run: func(*bolt.Tx) error { return nil }},
	// Nothing to change: the version is what keeps an older build out.
	{to: 6, what: "leases may be attachments", run: func(*bolt.Tx) error { return nil }},
	// prepare writes the older journal's changes into the file first, in
	// the same transaction, and marks the file closed: the journal is
	// then started again with its header.
	{to: 7, what: "held slots, the store's generation, the journal's header", run: func(tx *bolt.Tx) error {
		return tx.Bucket(bucketMeta).Put(keyGeneration, []byte(newGeneration()))
	}},
}

// LegacyPrincipal is the principal schema 3 gives the leases recorded
// before principals were: root on the control socket, the one principal
// that may act for every owner without a policy, so that their owners'
// tools running as root keep renewing and releasing them.
const LegacyPrincipal = "uid:0"

// LegacyCertificate prefixes the principal of a lease that a build before
// schema 5 recorded for a TLS client: "x509:<identity>" did not say
// whether the identity was the certificate's URI SAN, DNS SAN or common
// name, so a certificate of another kind with the same string would be
// that principal. It is read as "legacy:x509:<identity>", a form no live
// principal has: no certificate acts on such a lease as its principal,
// and a principal the policy lets lease for its owner still may (as root
// may).
const LegacyCertificate = "legacy:"

// legacyCertificate returns the principal a leased record written before
// schema 5 (without principal_kinds) names.
func legacyCertificate(m *recordpb.Record) string {
	if m.State == recordpb.State_STATE_LEASED && !m.PrincipalKinds && strings.HasPrefix(m.Principal, "x509:") {
		return LegacyCertificate + m.Principal
	}
	return m.Principal
}

// nameLegacy gives a lease recorded without a principal
// [LegacyPrincipal], and reports whether it did.
func nameLegacy(m *recordpb.Record) bool {
	if m.State != recordpb.State_STATE_LEASED || m.Principal != "" {
		return false
	}
	m.Principal = LegacyPrincipal
	return true
}

// nameLegacyPrincipals sets [LegacyPrincipal] on every leased record
// without a principal, keeping each record's other fields, unknown ones
// included. Records that do not decode are left for Load to report.
func nameLegacyPrincipals(tx *bolt.Tx) error {
	slots := tx.Bucket(bucketSlots)
	type fix struct {
		k, v []byte
	}
	var fixes []fix
	if err := slots.ForEach(func(k, v []byte) error {
		i, err := parseSlotKey(k)
		if err != nil {
			return err
		}
		var m recordpb.Record
		if proto.Unmarshal(v, &m) != nil || !nameLegacy(&m) {
			return nil
		}
		if _, err := fromMessage(i, &m); err != nil {
			return nil // invalid for another reason: Load reports it
		}
		b, err := marshal(&m)
		if err != nil {
			return err
		}
		fixes = append(fixes, fix{append([]byte(nil), k...), b})
		return nil
	}); err != nil {
		return err
	}
	for _, f := range fixes {
		if err := slots.Put(f.k, f.v); err != nil {
			return fmt.Errorf("slot %x: %w", f.k, err)
		}
	}
	return nil
}

// required lists the buckets each schema has besides meta.
func required(version int) [][]byte {
	if version >= 2 {
		return [][]byte{bucketSlots, bucketRequests}
	}
	return [][]byte{bucketSlots}
}

// buildRequestIndex indexes every leased record that has a request id.
// Schema 1 did not keep requests unique: where two records hold one
// request, the lower index gets it, which is what schema 1's lookup (a scan
// in index order) answered. Records that do not decode are not indexed;
// Load reports them.
func buildRequestIndex(tx *bolt.Tx) error {
	index, err := tx.CreateBucket(bucketRequests)
	if err != nil {
		return fmt.Errorf("create %s: %w", bucketRequests, err)
	}
	return tx.Bucket(bucketSlots).ForEach(func(k, v []byte) error {
		i, err := parseSlotKey(k)
		if err != nil {
			return err
		}
		// Read as schema 3 reads it: the principal step comes after this
		// one, and decode wants every lease to name one.
		var m recordpb.Record
		if proto.Unmarshal(v, &m) != nil {
			return nil
		}
		nameLegacy(&m)
		r, err := fromMessage(i, &m)
		if err != nil {
			return nil
		}
		rk := requestKeyOf(&r)
		if rk == nil || index.Get(rk) != nil {
			return nil
		}
		return index.Put(rk, slotKey(i))
	})
}

// readSchema returns the file's schema version, 0 for a file without any
// bucket (new, or made by a process that died before writing its first
// transaction).
func readSchema(tx *bolt.Tx) (int, error) {
	meta := tx.Bucket(bucketMeta)
	if meta == nil {
		var names []string
		_ = tx.ForEach(func(name []byte, _ *bolt.Bucket) error {
			names = append(names, strconv.Quote(string(name)))
			return nil
		})
		if len(names) == 0 {
			return 0, nil
		}
		return 0, fmt.Errorf("no %q bucket (buckets %v): not a lease store", bucketMeta, names)
	}
	raw := meta.Get(keySchema)
	v, err := strconv.Atoi(string(raw))
	if err != nil || v < 1 {
		return 0, fmt.Errorf("schema version %q is not a positive number", raw)
	}
	return v, nil
}

// prepare makes the file current: it initialises a new one, checks an
// existing one, and upgrades an older schema after a backup.
func (s *Store) prepare(migs []migration) error {
	var version int
	if err := s.view(func(tx *bolt.Tx) error {
		var err error
		if version, err = readSchema(tx); err != nil {
			return &CorruptError{Path: s.path, Err: err}
		}
		return nil
	}); err != nil {
		return err
	}
	if version == 0 {
		s.opened.Fresh = true
		return s.update(initialise)
	}
	if version > SchemaVersion {
		return &SchemaError{Path: s.path, Found: version, Supported: SchemaVersion}
	}
	if err := s.verify(version); err != nil {
		return err
	}
	if version == SchemaVersion {
		return nil
	}

	backup, err := s.backup(version)
	if err != nil {
		return err
	}
	s.opened.UpgradedFrom, s.opened.Backup = version, backup
	// Schemas 4 to 6 kept their latest writes in a journal without a
	// header: they go into the file with the upgrade, which then holds
	// every change (closed), so that the journal starts again in this
	// schema's form. The backup is of the file alone, as before.
	legacy := newChangeSet()
	if version >= 4 && version < 7 {
		if err := readLegacy(s.dir, s.name+JournalSuffix, legacy); err != nil {
			return err
		}
		s.opened.Replayed = legacy.len()
	}
	return s.update(func(tx *bolt.Tx) error {
		if err := legacy.applyTo(tx); err != nil {
			return err
		}
		if version < 7 {
			if err := markClosed(tx); err != nil {
				return err
			}
		}
		for _, m := range migs {
			if m.to <= version {
				continue
			}
			if err := m.run(tx); err != nil {
				return fmt.Errorf("upgrade to schema %d (%s): %w", m.to, m.what, err)
			}
		}
		meta := tx.Bucket(bucketMeta)
		if err := meta.Put(keySchema, []byte(strconv.Itoa(SchemaVersion))); err != nil {
			return err
		}
		note := fmt.Sprintf("%d -> %d at %s", version, SchemaVersion, time.Now().UTC().Format(time.RFC3339Nano))
		return meta.Put(keyUpgraded, []byte(note))
	})
}

// initialise writes a new file's buckets and meta: this schema, a new
// generation, and the time it was made, unvouched (see keyUnvouched).
func initialise(tx *bolt.Tx) error {
	meta, err := tx.CreateBucket(bucketMeta)
	if err != nil {
		return err
	}
	for _, b := range required(SchemaVersion) {
		if _, err := tx.CreateBucket(b); err != nil {
			return err
		}
	}
	if err := meta.Put(keySchema, []byte(strconv.Itoa(SchemaVersion))); err != nil {
		return err
	}
	if err := meta.Put(keyGeneration, []byte(newGeneration())); err != nil {
		return err
	}
	now := []byte(time.Now().UTC().Format(time.RFC3339Nano))
	if err := meta.Put(keyUnvouched, now); err != nil {
		return err
	}
	return meta.Put(keyCreated, now)
}

// verify reads every page of the file once, under the fault containment
// of view, and then runs bbolt's consistency check. The walk comes first
// because tx.Check runs on a goroutine of its own, where a page pointer
// outside the file would be a fatal fault rather than an error; after the
// walk every reachable page is known to be readable.
func (s *Store) verify(version int) error {
	// The file bbolt opened, not what the path names now.
	st, err := s.file.Stat()
	if err != nil {
		return fmt.Errorf("leases: %w", err)
	}
	return s.view(func(tx *bolt.Tx) error {
		if tx.Size() > st.Size() {
			return &CorruptError{Path: s.path, Err: fmt.Errorf("file is %d bytes but its pages reach %d: truncated", st.Size(), tx.Size())}
		}
		for _, b := range required(version) {
			if tx.Bucket(b) == nil {
				return &CorruptError{Path: s.path, Err: fmt.Errorf("schema %d without bucket %q", version, b)}
			}
		}
		if err := tx.ForEach(func(name []byte, b *bolt.Bucket) error {
			return walk(b)
		}); err != nil {
			return &CorruptError{Path: s.path, Err: err}
		}
		var errs []error
		for err := range tx.Check() {
			if len(errs) < 5 {
				errs = append(errs, err)
			}
		}
		if len(errs) > 0 {
			return &CorruptError{Path: s.path, Err: fmt.Errorf("bbolt check: %w", errors.Join(errs...))}
		}
		return nil
	})
}

// walk touches every key and value of b and its nested buckets.
func walk(b *bolt.Bucket) error {
	var prev []byte
	c := b.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		if prev != nil && bytes.Compare(prev, k) >= 0 {
			return fmt.Errorf("keys out of order: %x after %x", k, prev)
		}
		prev = k
		if v == nil {
			if nb := b.Bucket(k); nb != nil {
				if err := walk(nb); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// backupName is the copy of the store name taken before an upgrade from
// schema version.
func backupName(name string, version int) string {
	return fmt.Sprintf("%s.schema%d.bak", name, version)
}

// isBackup reports whether n is a copy of the store name that backup took
// (Remove removes them with the store).
func isBackup(name, n string) bool {
	v, ok := strings.CutPrefix(n, name+".schema")
	if !ok {
		return false
	}
	v, ok = strings.CutSuffix(v, ".bak")
	_, err := strconv.Atoi(v)
	return ok && err == nil
}

// backup copies the file, as of now, to backupName before an upgrade (the
// file is locked: nothing changes it meanwhile), in the store's directory
// and through no link.
func (s *Store) backup(version int) (string, error) {
	dst := backupName(s.name, version)
	tmp := dst + ".tmp"
	err := s.view(func(tx *bolt.Tx) error {
		f, err := s.dir.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
		if err != nil {
			return err
		}
		_, err = tx.WriteTo(f)
		if serr := f.Sync(); err == nil {
			err = serr
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
		return s.dir.Rename(tmp, dst)
	})
	if err == nil {
		err = s.dir.Sync()
	}
	if err != nil {
		s.dir.Remove(tmp)
		return "", fmt.Errorf("leases: back up %s before upgrading it from schema %d: %w", s.path, version, err)
	}
	return s.dir.Join(dst), nil
}
