package leases

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// validStore writes n records and returns the path and the records.
func validStore(t *testing.T, n int) (string, []Record) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "leases.db")
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	recs := make([]Record, n)
	for i := range recs {
		recs[i] = leased(i+1, fmt.Sprintf("owner-%05d", i+1), fmt.Sprintf("req-%d", i+1))
	}
	if err := s.Put(context.Background(), recs...); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return path, recs
}

// pageOf returns the offset of the page holding marker in the file.
func pageOf(t *testing.T, path, marker string) int64 {
	t.Helper()
	b := readFile(t, path)
	at := bytes.Index(b, []byte(marker))
	if at < 0 {
		t.Fatalf("%q not in %s", marker, path)
	}
	ps := int64(os.Getpagesize())
	return int64(at) / ps * ps
}

func overwrite(t *testing.T, path string, off int64, b []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

func randomBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, seed))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func TestCorruptFilesGiveCorruptError(t *testing.T) {
	ps := int64(os.Getpagesize())
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, path string)
	}{
		{"random bytes", func(t *testing.T, path string) {
			if err := os.WriteFile(path, randomBytes(1, 64<<10), 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{"a text file", func(t *testing.T, path string) {
			if err := os.WriteFile(path, []byte("not a database\n"), 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{"truncated to 100 bytes", func(t *testing.T, path string) { truncate(t, path, 100) }},
		{"truncated to 3 pages", func(t *testing.T, path string) { truncate(t, path, 3*ps) }},
		{"truncated to half", func(t *testing.T, path string) { truncate(t, path, fileSize(t, path)/2) }},
		{"truncated one page below its high-water mark", func(t *testing.T, path string) { truncate(t, path, highWater(t, path)-ps) }},
		{"both meta pages garbage", func(t *testing.T, path string) { overwrite(t, path, 0, randomBytes(2, int(2*ps))) }},
		{"garbage over a leaf page", func(t *testing.T, path string) {
			overwrite(t, path, pageOf(t, path, "owner-00500"), randomBytes(3, int(ps)))
		}},
		{"a leaf page's header says free page", func(t *testing.T, path string) {
			// page header: id (8 bytes), flags (2), count (2), overflow (4)
			overwrite(t, path, pageOf(t, path, "owner-00500")+8, []byte{0x10, 0x00})
		}},
		{"a branch element pointing past the file", func(t *testing.T, path string) {
			overwrite(t, path, pageOf(t, path, "owner-00500"), bytes.Repeat([]byte{0x01}, 8)) // page id
			overwrite(t, path, pageOf(t, path, "owner-00500")+8, []byte{0x01, 0x00})          // branch
		}},
		{"a directory", func(t *testing.T, path string) {
			os.Remove(path)
			if err := os.Mkdir(path, 0o700); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path, _ := validStore(t, 1000)
			tc.damage(t, path)
			damaged, _ := os.ReadFile(path)
			_, err := Open(path, Options{})
			var ce *CorruptError
			if !errors.As(err, &ce) || ce.Path != path {
				t.Fatalf("Open: %v, want *CorruptError", err)
			}
			t.Logf("%v", err)
			if tc.name == "a directory" {
				return
			}
			moved, err := MoveAside(path)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(moved, path+".corrupt-") || !bytes.Equal(readFile(t, moved), damaged) {
				t.Fatalf("MoveAside moved to %s, not the damaged file as it was", moved)
			}
			s, err := Open(path, Options{})
			if err != nil {
				t.Fatalf("Open after MoveAside: %v", err)
			}
			defer s.Close()
			if !s.Opened().Fresh {
				t.Fatal("the store after MoveAside is not Fresh")
			}
		})
	}
}

func truncate(t *testing.T, path string, size int64) {
	t.Helper()
	if err := os.Truncate(path, size); err != nil {
		t.Fatal(err)
	}
}

// highWater returns the size of the pages bbolt uses in the file at path
// (the file itself may be longer: bbolt grows it ahead).
func highWater(t *testing.T, path string) int64 {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var size int64
	if err := db.View(func(tx *bolt.Tx) error { size = tx.Size(); return nil }); err != nil {
		t.Fatal(err)
	}
	return size
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Size()
}

// TestRandomDamageNeverPanics writes random bytes over random spans of a
// valid store, many times over. Open must never panic or fault the process:
// it either opens (and then Load, Get and a write work or fail with an
// error) or returns a *CorruptError.
func TestRandomDamageNeverPanics(t *testing.T) {
	path, _ := validStore(t, 2000)
	orig := readFile(t, path)
	ps := os.Getpagesize()
	r := rand.New(rand.NewPCG(7, 7))
	opened, corrupt := 0, 0
	for round := range 300 {
		b := bytes.Clone(orig)
		for range 1 + r.IntN(3) {
			at, n := r.IntN(len(b)), 1+r.IntN(2*ps)
			if round%3 == 0 {
				at = 2*ps + r.IntN(len(b)-2*ps) // spare the meta pages: damage the data
			}
			for i := at; i < min(at+n, len(b)); i++ {
				b[i] = byte(r.Uint32())
			}
		}
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		s, err := Open(path, Options{})
		var ce *CorruptError
		switch {
		case err == nil:
			opened++
			_, lerr := s.Load()
			var re *RecordsError
			if lerr != nil && !errors.As(lerr, &re) && !errors.As(lerr, &ce) {
				t.Fatalf("round %d: Load: %T %v", round, lerr, lerr)
			}
			_, _, _ = s.Get(1 + r.IntN(2000))
			_ = s.Put(context.Background(), idle(1+r.IntN(2000)))
			s.Close()
		case errors.As(err, &ce):
			corrupt++
		default:
			t.Fatalf("round %d: Open: %T %v", round, err, err)
		}
	}
	t.Logf("300 damaged files: %d opened, %d refused as corrupt", opened, corrupt)
}

// TestOneDamagedMetaFallsBackToThePreviousCommit documents bbolt's crash
// recovery: of its two meta pages, the newer one (written last, so the one
// a crash can tear) is damaged, and the file opens as of the commit before.
// A torn meta means its commit never returned, so no reply depended on it.
func TestOneDamagedMetaFallsBackToThePreviousCommit(t *testing.T) {
	path := filepath.Join(t.TempDir(), "leases.db")
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// Each record in a commit of its own: the journal's checkpoint.
	for i := 1; i <= 2; i++ {
		if err := s.Put(ctx, idle(i)); err != nil {
			t.Fatal(err)
		}
		if err := s.flush(); err != nil {
			t.Fatal(err)
		}
	}
	var txid int
	if err := s.db.View(func(tx *bolt.Tx) error { txid = tx.ID(); return nil }); err != nil {
		t.Fatal(err)
	}
	abandon(t, s) // as a kill leaves it: Close would commit once more
	ps := int64(os.Getpagesize())
	overwrite(t, path, int64(txid%2)*ps+16, randomBytes(4, 64)) // the newest meta, past its page header

	s, err = Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	recs, err := s.Load()
	if err != nil || len(recs) != 1 || recs[0].Index != 1 {
		t.Fatalf("Load = %v, %v; want slot 1 only (the commit before the damaged one)", recs, err)
	}
}

func TestOpenInAMissingDirectoryIsNotCorrupt(t *testing.T) {
	path := filepath.Join(t.TempDir(), "missing", "leases.db")
	_, err := Open(path, Options{})
	var ce *CorruptError
	if !errors.Is(err, fs.ErrNotExist) || errors.As(err, &ce) {
		t.Fatalf("Open in a missing directory: %T %v, want ENOENT, not *CorruptError", err, err)
	}
}

func TestUndecodableRecordIsReportedNotFatal(t *testing.T) {
	path, recs := validStore(t, 50)
	// Slot 20's owner is field 2: tag byte 0x12, then its length. Field
	// number 0 is invalid protobuf.
	// (The owner also appears in the request index's key, without the tag.)
	b := readFile(t, path)
	field := append([]byte{0x12, byte(len("owner-00020"))}, "owner-00020"...)
	if n := bytes.Count(b, field); n != 1 {
		t.Fatalf("slot 20's owner field found %d times", n)
	}
	overwrite(t, path, int64(bytes.Index(b, field)), []byte{0x00})

	s, err := Open(path, Options{})
	if err != nil {
		t.Fatalf("Open: %v (a bad value is not a bad file)", err)
	}
	defer s.Close()
	got, err := s.Load()
	var re *RecordsError
	if !errors.As(err, &re) || len(re.Bad) != 1 || re.Bad[20] == nil {
		t.Fatalf("Load: %v, want *RecordsError naming slot 20", err)
	}
	if len(got) != len(recs)-1 {
		t.Fatalf("Load returned %d records, want the %d readable ones", len(got), len(recs)-1)
	}
	if _, _, err := s.Get(20); !errors.As(err, &re) {
		t.Fatalf("Get(20): %v, want *RecordsError", err)
	}
	if _, err := s.Update(context.Background(), 20, func(*Record) error { return nil }); !errors.As(err, &re) {
		t.Fatalf("Update(20): %v, want *RecordsError", err)
	}
	// Replacing it (after an operator decided) works and reindexes.
	if err := s.Put(context.Background(), leased(20, "owner-00020", "req-20")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Load(); err != nil {
		t.Fatal(err)
	}
	checkRequestIndex(t, s)
}
