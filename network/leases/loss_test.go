package leases

import (
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/phasegate/phasegate/network/netns"
)

// TestJournalLossIsDetected: after a kill, a journal removed, emptied, cut
// inside an entry or at an entry's end, or replaced by another store's,
// is a loss Open reports (and records until ClearLoss), never a silent
// one; what the journal still holds whole is replayed.
func TestJournalLossIsDetected(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, jpath string)
		reason string
	}{
		{"removed", func(t *testing.T, jpath string) { remove(t, jpath) }, "missing"},
		{"emptied", func(t *testing.T, jpath string) { truncate(t, jpath, 0) }, "emptied"},
		{"header cut", func(t *testing.T, jpath string) { truncate(t, jpath, headerLen/2) }, "emptied"},
		{"cut inside an entry", func(t *testing.T, jpath string) { _, end := lastVouched(t, jpath); truncate(t, jpath, end-3) }, "is torn"},
		{"cut at an entry's end", func(t *testing.T, jpath string) { start, _ := lastVouched(t, jpath); truncate(t, jpath, start) }, "after its entry"},
		{"another store's", func(t *testing.T, jpath string) {
			other := filepath.Join(t.TempDir(), "other.db")
			writeAndKill(t, other, 5000, 20)
			b, err := os.ReadFile(other + JournalSuffix)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(jpath, b, 0o600); err != nil {
				t.Fatal(err)
			}
		}, "not this store's"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path, _ := killedStore(t, t.TempDir())
			jpath := path + JournalSuffix
			tc.damage(t, jpath)
			s, err := Open(path, Options{})
			if err != nil {
				t.Fatal(err)
			}
			l := s.Opened().JournalLoss
			if l == nil || !strings.Contains(l.Reason, tc.reason) || l.Path != jpath || l.At.IsZero() {
				t.Fatalf("JournalLoss %+v; want one naming %s and %q", l, jpath, tc.reason)
			}
			// Recorded: a start killed before it dealt with the loss
			// finds it again.
			abandon(t, s)
			s, err = Open(path, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if l2 := s.Opened().JournalLoss; l2 == nil || l2.Reason != l.Reason {
				t.Fatalf("after a kill: JournalLoss %+v, want %+v again", l2, l)
			}
			if err := s.ClearLoss(context.Background()); err != nil {
				t.Fatal(err)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s, err = Open(path, Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if l := s.Opened().JournalLoss; l != nil {
				t.Fatalf("after ClearLoss and Close: JournalLoss %+v", l)
			}
			checkRequestIndex(t, s)
		})
	}
}

// TestTornEntryNamesItsLeases: a journal cut inside an entry whose writers
// were told names the leases the entry's whole changes still show.
func TestTornEntryNamesItsLeases(t *testing.T) {
	path := filepath.Join(t.TempDir(), "leases.db")
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := s.Put(ctx, leased(1, "ci", "first")); err != nil {
		t.Fatal(err)
	}
	start := size(t, path+JournalSuffix)
	if err := s.Put(ctx, leased(7, "build-7", "req-7")); err != nil {
		t.Fatal(err)
	}
	abandon(t, s)
	// Cut the last entry just before its end: its first changes are whole.
	truncate(t, path+JournalSuffix, size(t, path+JournalSuffix)-1)
	s, err = Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	l := s.Opened().JournalLoss
	if l == nil {
		t.Fatal("no loss reported")
	}
	found := false
	for _, n := range l.Named {
		if n.Index == 7 && n.Owner == "build-7" && n.RequestID == "req-7" {
			found = true
		}
	}
	if !found {
		t.Fatalf("loss %+v (entry at %d) does not name slot 7 of build-7, request req-7", l, start)
	}
	if _, ok, _ := s.Get(1); !ok {
		t.Fatal("the whole entry before the cut was not replayed")
	}
}

// TestClosedStoreLosesNothing: once Close wrote every change into the
// file, a journal removed or emptied loses nothing.
func TestClosedStoreLosesNothing(t *testing.T) {
	for _, damage := range []func(t *testing.T, jpath string){
		func(t *testing.T, jpath string) { remove(t, jpath) },
		func(t *testing.T, jpath string) { truncate(t, jpath, 0) },
	} {
		path, told := killedStore(t, t.TempDir())
		s := holds(t, path, told)
		if s.Opened().WasClosed {
			t.Fatal("a killed store says it was closed")
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		damage(t, path+JournalSuffix)
		s = holds(t, path, told)
		if o := s.Opened(); o.JournalLoss != nil || !o.WasClosed {
			t.Fatalf("after Close: opened %+v, want closed and no loss", o)
		}
	}
}

// TestJournalHeaderNamesTheStore: the journal carries the store's
// generation, which a fresh store draws anew.
func TestJournalHeaderNamesTheStore(t *testing.T) {
	s := openTemp(t)
	g := s.Opened().Generation
	b, err := os.ReadFile(s.jnl.path)
	if err != nil {
		t.Fatal(err)
	}
	hg, reach, ok := parseHeader(b)
	if !validGeneration([]byte(g)) || !ok || hg != g || reach != headerLen {
		t.Fatalf("generation %q, header %q %d %v", g, hg, reach, ok)
	}
	if g2 := openTemp(t).Opened().Generation; g2 == g {
		t.Fatalf("two stores share generation %s", g)
	}
}

// TestNewStoreIsUnvouchedUntilVouched: a store is unvouched from its
// making until Vouched, across Opens in between.
func TestNewStoreIsUnvouchedUntilVouched(t *testing.T) {
	path := filepath.Join(t.TempDir(), "leases.db")
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !s.Opened().Unvouched {
		t.Fatal("a new store is not unvouched")
	}
	abandon(t, s)
	if s, err = Open(path, Options{}); err != nil || !s.Opened().Unvouched {
		t.Fatalf("reopened before Vouched: %+v %v, want unvouched", s.Opened(), err)
	}
	if err := s.Vouched(context.Background()); err != nil {
		t.Fatal(err)
	}
	abandon(t, s)
	if s, err = Open(path, Options{}); err != nil || s.Opened().Unvouched {
		t.Fatalf("reopened after Vouched: %+v %v, want vouched", s.Opened(), err)
	}
	s.Close()
}

// TestHeldRecord: a held record keeps its identity and hints, needs its
// time and reason, and is in no request index.
func TestHeldRecord(t *testing.T) {
	s := openTemp(t)
	ctx := context.Background()
	h := Record{Index: 3, State: Held, Netns: netns.ID{Dev: 4, Ino: 4026532003}, HostIfindex: 103, Owner: "ci", RequestID: "r3",
		HeldSince: t0, HeldReason: "the state file was lost"}
	if err := s.Put(ctx, h); err != nil {
		t.Fatal(err)
	}
	if got, ok, err := s.Get(3); err != nil || !ok || got.State != Held || got.Owner != "ci" || !got.HeldSince.Equal(t0) || got.HeldReason != h.HeldReason {
		t.Fatalf("Get = %+v %v %v", got, ok, err)
	}
	if _, ok, _ := s.ByRequest("ci", "r3"); ok {
		t.Fatal("a held record's hint is in the request index")
	}
	// A lease may take the same request elsewhere.
	if err := s.Put(ctx, leased(4, "ci", "r3")); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []Record{
		{Index: 5, State: Held, HeldReason: "no time"},
		{Index: 5, State: Held, HeldSince: t0, LeaseID: "x", HeldReason: "a lease id"},
		func() Record { r := idle(5); r.HeldSince = t0; return r }(),
	} {
		if err := s.Put(ctx, bad); err == nil {
			t.Errorf("Put(%+v) accepted", bad)
		}
	}
}

func remove(t *testing.T, p string) {
	t.Helper()
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
}

func size(t *testing.T, p string) int64 {
	t.Helper()
	st, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return st.Size()
}

// lastVouched returns where the journal's last entry within its header's
// reach starts and ends: the last write a writer was told of. An entry
// past the reach is one a kill caught between its write and the header's
// update, which no writer was told of and whose loss is none.
func lastVouched(t *testing.T, jpath string) (start, end int64) {
	t.Helper()
	b, err := os.ReadFile(jpath)
	if err != nil {
		t.Fatal(err)
	}
	starts, ends := vouchedEntries(b)
	if len(starts) < 2 {
		t.Fatalf("journal of %d bytes: want two entries or more within its reach", len(b))
	}
	return int64(starts[len(starts)-1]), int64(ends[len(ends)-1])
}

// vouchedEntries is where each whole entry of journal b within its
// header's reach starts and ends.
func vouchedEntries(b []byte) (starts, ends []int) {
	_, reach, ok := parseHeader(b)
	if !ok {
		return nil, nil
	}
	for off := headerLen; off+entryHeader <= len(b); {
		end := off + entryHeader + int(binary.LittleEndian.Uint32(b[off:]))
		if end > len(b) || uint64(end) > reach {
			break
		}
		starts, ends = append(starts, off), append(ends, end)
		off = end
	}
	return starts, ends
}
