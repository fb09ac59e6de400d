package leases

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/phasegate/phasegate/network/leases/internal/recordpb"
)

// writeSchema1 writes, with bbolt alone, a file of schema 1: meta and
// slots, no request index, and two records holding one request (schema 1
// did not keep requests unique).
func writeSchema1(t *testing.T, path string, recs ...Record) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.Update(func(tx *bolt.Tx) error {
		meta, err := tx.CreateBucket([]byte("meta"))
		if err != nil {
			return err
		}
		if err := meta.Put([]byte("schema"), []byte("1")); err != nil {
			return err
		}
		if err := meta.Put([]byte("created"), []byte("2026-11-01T00:00:00Z")); err != nil {
			return err
		}
		slots, err := tx.CreateBucket([]byte("slots"))
		if err != nil {
			return err
		}
		for _, r := range recs {
			v, err := encode(&r)
			if err != nil {
				return err
			}
			if err := slots.Put(slotKey(r.Index), v); err != nil {
				return err
			}
		}
		// A record schema 1 could hold but that no longer decodes: the
		// upgrade must not fail on it.
		return slots.Put(slotKey(999), []byte{0xff, 0xff})
	}); err != nil {
		t.Fatal(err)
	}
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestOpenUpgradesSchema1(t *testing.T) {
	path := filepath.Join(t.TempDir(), "leases.db")
	dupLow, dupHigh := leased(5, "ci", "dup"), leased(8, "ci", "dup")
	recs := []Record{leased(2, "ci", "a"), idle(3), dupHigh, dupLow, leased(9, "ci", "")}
	// Schema 1 and 2 recorded no principal; schema 3 gives those leases
	// root's.
	var old []Record
	for i := range recs {
		r := recs[i]
		r.Principal = ""
		old = append(old, r)
		if r.State == Leased {
			recs[i].Principal = LegacyPrincipal
		}
	}
	writeSchema1(t, path, old...)
	origSlots := dumpSlots(t, path)

	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	o := s.Opened()
	if o.Fresh || o.UpgradedFrom != 1 || o.Backup != path+".schema1.bak" {
		t.Fatalf("Opened() = %+v", o)
	}
	checkUpgradedFrom1(t, s, o.Backup, origSlots)
	for _, r := range []Record{recs[0], dupLow} {
		got, ok, err := s.ByRequest(r.Owner, r.RequestID)
		if err != nil || !ok {
			t.Fatalf("ByRequest(%q) after upgrade = %v, %v", r.RequestID, ok, err)
		}
		sameRecord(t, got, r)
	}
	loaded, err := s.Load()
	var re *RecordsError
	if !errors.As(err, &re) || len(re.Bad) != 1 || re.Bad[999] == nil {
		t.Fatalf("Load: %v, want a *RecordsError naming slot 999", err)
	}
	if len(loaded) != len(recs) {
		t.Fatalf("Load after upgrade: %d records, want %d", len(loaded), len(recs))
	}
	checkIndexIgnoringBad(t, s)
	s.Close()

	// The upgrade is done once.
	s, err = Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if o := s.Opened(); o.Fresh || o.UpgradedFrom != 0 || o.Backup != "" {
		t.Fatalf("second Open after the upgrade: %+v", s.Opened())
	}
}

// checkUpgradedFrom1 checks a store upgraded from schema 1: its backup is
// the schema 1 file (as a copy: bbolt rewrites its meta pages, so it is
// compared by content, not bytes), and its meta says this schema and the
// upgrade.
func checkUpgradedFrom1(t *testing.T, s *Store, backup, origSlots string) {
	t.Helper()
	if got := dumpSlots(t, backup); got != origSlots {
		t.Fatal("the backup's slots differ from the file's before the upgrade")
	}
	bdb, err := bolt.Open(backup, 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := bdb.View(func(tx *bolt.Tx) error {
		if v, err := readSchema(tx); v != 1 || err != nil || tx.Bucket(bucketRequests) != nil {
			t.Errorf("backup: schema %d (%v), request index %v; want schema 1 without index", v, err, tx.Bucket(bucketRequests) != nil)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	bdb.Close()
	if err := s.db.View(func(tx *bolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		if v := string(meta.Get(keySchema)); v != strconv.Itoa(SchemaVersion) {
			t.Errorf("schema after upgrade = %q", v)
		}
		if v := string(meta.Get(keyUpgraded)); !strings.HasPrefix(v, fmt.Sprintf("1 -> %d at ", SchemaVersion)) {
			t.Errorf("upgraded = %q", v)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// putRaw stores v as slot r.Index's record, and r's request in the
// index, in tx: a record as an older schema wrote it.
func putRaw(tx *bolt.Tx, r Record, v []byte) error {
	if err := tx.Bucket(bucketSlots).Put(slotKey(r.Index), v); err != nil {
		return err
	}
	return tx.Bucket(bucketRequests).Put(requestKeyOf(&r), slotKey(r.Index))
}

// dumpSlots returns the slots bucket of the bbolt file at path as text.
func dumpSlots(t *testing.T, path string) string {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var b strings.Builder
	if err := db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketSlots).ForEach(func(k, v []byte) error {
			fmt.Fprintf(&b, "%x=%x\n", k, v)
			return nil
		})
	}); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func checkIndexIgnoringBad(t *testing.T, s *Store) {
	t.Helper()
	if err := s.Delete(context.Background(), 999); err != nil {
		t.Fatal(err)
	}
	checkIndexOf(t, s, true)
}

// TestFailedUpgradeChangesNothing runs the real migration followed by one
// that fails, in the one upgrade transaction: the file must stay schema 1,
// byte for byte.
func TestFailedUpgradeChangesNothing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "leases.db")
	writeSchema1(t, path, leased(2, "ci", "a"))
	orig := readFile(t, path)
	boom := errors.New("boom")
	migs := append(append([]migration(nil), migrations...), migration{to: SchemaVersion + 1, what: "fail", run: func(*bolt.Tx) error { return boom }})
	if _, err := open(path, Options{}, migs); !errors.Is(err, boom) {
		t.Fatalf("open with a failing migration: %v", err)
	}
	if !bytes.Equal(readFile(t, path), orig) {
		t.Fatal("a failed upgrade changed the file")
	}
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Opened().UpgradedFrom != 1 {
		t.Fatalf("after a failed upgrade the file is not schema 1 any more: %+v", s.Opened())
	}
}

func TestOpenRefusesNewerSchema(t *testing.T) {
	path := filepath.Join(t.TempDir(), "leases.db")
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketMeta).Put(keySchema, []byte(strconv.Itoa(SchemaVersion+1)))
	}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	orig := readFile(t, path)
	_, err = Open(path, Options{})
	var se *SchemaError
	if !errors.As(err, &se) || se.Found != SchemaVersion+1 || se.Supported != SchemaVersion || se.Path != path {
		t.Fatalf("Open of a schema %d file: %v, want *SchemaError{Found: %d, Supported: %d}", SchemaVersion+1, err, SchemaVersion+1, SchemaVersion)
	}
	msg := err.Error()
	if strings.Contains(msg, "\n") || !strings.Contains(msg, strconv.Itoa(SchemaVersion+1)) || !strings.Contains(msg, fmt.Sprintf("(%d)", SchemaVersion)) || !strings.Contains(msg, path) {
		t.Fatalf("message is not one line naming path, found and supported versions: %q", msg)
	}
	if !bytes.Equal(readFile(t, path), orig) {
		t.Fatal("refusing a newer schema changed the file")
	}
}

func TestOpenRefusesForeignLayouts(t *testing.T) {
	for _, tc := range []struct {
		name  string
		build func(tx *bolt.Tx) error
	}{
		{"buckets without meta", func(tx *bolt.Tx) error {
			_, err := tx.CreateBucket([]byte("allocations"))
			return err
		}},
		{"schema not a number", func(tx *bolt.Tx) error {
			b, err := tx.CreateBucket(bucketMeta)
			if err != nil {
				return err
			}
			return b.Put(keySchema, []byte("two"))
		}},
		{"schema 2 without the request index", func(tx *bolt.Tx) error {
			b, err := tx.CreateBucket(bucketMeta)
			if err != nil {
				return err
			}
			if _, err := tx.CreateBucket(bucketSlots); err != nil {
				return err
			}
			return b.Put(keySchema, []byte("2"))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "leases.db")
			db, err := bolt.Open(path, 0o600, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := db.Update(tc.build); err != nil {
				t.Fatal(err)
			}
			db.Close()
			_, err = Open(path, Options{})
			var ce *CorruptError
			if !errors.As(err, &ce) || ce.Path != path {
				t.Fatalf("Open: %v, want *CorruptError", err)
			}
		})
	}
}

func TestEmptyBoltFileIsFresh(t *testing.T) {
	path := filepath.Join(t.TempDir(), "leases.db")
	db, err := bolt.Open(path, 0o600, nil) // a process that died before its first transaction
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !s.Opened().Fresh {
		t.Fatal("a bbolt file without buckets is not reported Fresh")
	}
}

// A schema 2 file's leases name no principal: the upgrade gives them
// root's, keeping every other field, those it does not know included.
func TestOpenUpgradesSchema2NamesPrincipals(t *testing.T) {
	path := filepath.Join(t.TempDir(), "leases.db")
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	before := leased(4, "ci", "q")
	before.Principal = ""
	v, err := encode(&before)
	if err != nil {
		t.Fatal(err)
	}
	v = protowire.AppendTag(v, 99, protowire.BytesType)
	v = protowire.AppendString(v, "from the future")
	if err := s.db.Update(func(tx *bolt.Tx) error {
		if err := tx.Bucket(bucketSlots).Put(slotKey(4), v); err != nil {
			return err
		}
		if err := tx.Bucket(bucketRequests).Put(requestKeyOf(&before), slotKey(4)); err != nil {
			return err
		}
		return tx.Bucket(bucketMeta).Put(keySchema, []byte("2"))
	}); err != nil {
		t.Fatal(err)
	}
	s.Close()

	s, err = Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if o := s.Opened(); o.UpgradedFrom != 2 || o.Backup != path+".schema2.bak" {
		t.Fatalf("Opened() = %+v, want an upgrade from 2 with a backup", o)
	}
	got, ok, err := s.ByRequest("ci", "q")
	if err != nil || !ok {
		t.Fatalf("ByRequest after upgrade = %v, %v", ok, err)
	}
	want := before
	want.Principal = LegacyPrincipal
	sameRecord(t, got, want)
	if !hasField99(t, s, 4) {
		t.Fatal("the upgrade dropped a field it does not know")
	}
}

// encodeSchema4 encodes r as a build before schema 5 did: without
// principal_kinds.
func encodeSchema4(t *testing.T, r Record) []byte {
	t.Helper()
	var m recordpb.Record
	fill(&m, &r)
	m.PrincipalKinds = false
	v, err := marshal(&m)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// A schema 4 file's certificate principals did not say which part of the
// certificate named them: "x509:cn:spiffe://…" may have been a URI SAN
// "cn:spiffe://…". After the upgrade every one of them, in the file and
// in its journal, reads as legacy:x509:…, which no live principal is, and
// stays so when the record is written again; the rest read as they were,
// and a principal recorded since reads as it was written.
func TestOpenUpgradesSchema4CertificatePrincipalsToLegacy(t *testing.T) {
	path := filepath.Join(t.TempDir(), "leases.db")
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	old := map[int]string{
		2: "x509:spiffe://x/ns/ci/sa/builder",
		3: "x509:cn:spiffe://x/ns/ci/sa/builder",
		5: "uid:1000",
		6: "x509:dns:builder.example.org", // in the journal
	}
	recs := map[int]Record{}
	for i, p := range old {
		r := leased(i, "ci", fmt.Sprint("req-", i))
		if i == 6 {
			r.RequestID = ""
		}
		r.Principal = p
		recs[i] = r
	}
	writeSchema4(t, path, []Record{recs[2], recs[3], recs[5]}, recs[6])

	want := map[int]string{
		2: "legacy:x509:spiffe://x/ns/ci/sa/builder",
		3: "legacy:x509:cn:spiffe://x/ns/ci/sa/builder",
		5: "uid:1000",
		6: "legacy:x509:dns:builder.example.org",
		7: "x509:cn:spiffe://x/ns/ci/sa/builder", // recorded since
	}
	s, err = Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if o := s.Opened(); o.UpgradedFrom != 4 || o.Replayed != 1 {
		t.Fatalf("Opened() = %+v, want an upgrade from 4 and one change replayed", o)
	}
	ctx := context.Background()
	r7 := leased(7, "ci", "req-7")
	r7.Principal = want[7]
	if err := s.Put(ctx, r7); err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{3, 6} {
		if _, err := s.Update(ctx, i, func(r *Record) error { r.Expires = r.Expires.Add(time.Minute); return nil }); err != nil {
			t.Fatal(err)
		}
	}
	checkPrincipals(t, s, want)
	s.Close()
	s, err = Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	checkPrincipals(t, s, want)
}

// writeSchema4 makes the store at path a schema 4 file holding recs, and
// its journal (schema 4's: entries without the header of schema 7)
// holding journaled.
func writeSchema4(t *testing.T, path string, recs []Record, journaled Record) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		for _, r := range recs {
			if err := putRaw(tx, r, encodeSchema4(t, r)); err != nil {
				return err
			}
		}
		return tx.Bucket(bucketMeta).Put(keySchema, []byte("4"))
	}); err != nil {
		t.Fatal(err)
	}
	db.Close()
	c := newChangeSet()
	c.put(inSlots, string(slotKey(journaled.Index)), encodeSchema4(t, journaled))
	if err := os.WriteFile(path+JournalSuffix, encodeEntry(nil, c), 0o600); err != nil {
		t.Fatal(err)
	}
}

// checkPrincipals checks that s holds a record of each index of want with
// its principal, and finds slot 3's by its request.
func checkPrincipals(t *testing.T, s *Store, want map[int]string) {
	t.Helper()
	got, err := s.Load()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("Load: %d records, want %d", len(got), len(want))
	}
	for _, r := range got {
		if r.Principal != want[r.Index] {
			t.Errorf("slot %d: principal %q, want %q", r.Index, r.Principal, want[r.Index])
		}
	}
	if r, ok, err := s.ByRequest("ci", "req-3"); err != nil || !ok || r.Principal != want[3] {
		t.Errorf("ByRequest of slot 3: %q %v %v, want %q", r.Principal, ok, err, want[3])
	}
}

// TestUpgradeTo7CarriesTheOldJournal: schema 6's journal, without a
// header, goes into the file with the upgrade to 7, which draws the
// store's generation; a kill after the upgrade's commit leaves the old
// journal beside a file marked closed, which the next Open starts again
// without a loss and without setting anything aside.
func TestUpgradeTo7CarriesTheOldJournal(t *testing.T) {
	path := filepath.Join(t.TempDir(), "leases.db")
	r1, r2 := leased(1, "ci", "req-1"), leased(2, "ci", "req-2")
	legacy := writeSchema6(t, path, r1, r2)
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	o := s.Opened()
	if o.UpgradedFrom != 6 || o.Replayed != 2 || !validGeneration([]byte(o.Generation)) || o.JournalLoss != nil {
		t.Fatalf("Opened() = %+v; want an upgrade from 6, the old journal's 2 changes, a generation, no loss", o)
	}
	for _, want := range []Record{r1, r2} {
		if got, ok, err := s.Get(want.Index); err != nil || !ok || got.LeaseID != want.LeaseID {
			t.Fatalf("slot %d after the upgrade: %+v %v %v", want.Index, got, ok, err)
		}
	}
	checkRequestIndex(t, s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// What a kill between the upgrade's commit and the journal's start
	// leaves: the old journal beside a closed file.
	if err := os.WriteFile(path+JournalSuffix, legacy, 0o600); err != nil {
		t.Fatal(err)
	}
	s, err = Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if o := s.Opened(); o.JournalLoss != nil || o.OrphanJournal != "" || o.Generation == "" {
		t.Fatalf("Opened() after a kill mid-upgrade = %+v; want no loss and nothing set aside", o)
	}
	if k := KeptAside(path).All(); len(k) != 0 {
		t.Fatalf("set aside: %v", k)
	}
	if got, ok, _ := s.Get(2); !ok || got.LeaseID != r2.LeaseID {
		t.Fatalf("slot 2 after a kill mid-upgrade: %+v %v", got, ok)
	}
}

// writeSchema6 makes the store at path a schema 6 file holding inFile, and
// its journal (schema 6's, without a header) holding journaled, written
// after the file's last checkpoint; it returns the journal.
func writeSchema6(t *testing.T, path string, inFile, journaled Record) []byte {
	t.Helper()
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		meta, err := tx.CreateBucket(bucketMeta)
		if err != nil {
			return err
		}
		for _, b := range required(6) {
			if _, err := tx.CreateBucket(b); err != nil {
				return err
			}
		}
		v, err := encode(&inFile)
		if err != nil {
			return err
		}
		if err := putRaw(tx, inFile, v); err != nil {
			return err
		}
		return meta.Put(keySchema, []byte("6"))
	}); err != nil {
		t.Fatal(err)
	}
	db.Close()
	c := newChangeSet()
	v, err := encode(&journaled)
	if err != nil {
		t.Fatal(err)
	}
	c.put(inSlots, string(slotKey(journaled.Index)), v)
	c.put(inRequests, string(requestKeyOf(&journaled)), slotKey(journaled.Index))
	legacy := encodeEntry(nil, c)
	if err := os.WriteFile(path+JournalSuffix, legacy, 0o600); err != nil {
		t.Fatal(err)
	}
	return legacy
}
