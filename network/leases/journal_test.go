package leases

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// killedStore leaves under dir a store whose writer was killed in
// the middle of its writes (the helper's write mode), its last writes in
// the journal alone, and returns the writes it told.
//
// The writer checkpoints whenever its writes pause for checkpointIdle,
// which a loaded machine can make it do just before the kill, leaving a
// journal of fewer than two entries within its header's reach, too few
// for the damages the tests make. Such a run is a setup that did not happen, not a result: it is
// made again, in a directory of its own, a few times.
func killedStore(t *testing.T, dir string) (string, map[int]string) {
	t.Helper()
	const tries = 5
	for try := range tries {
		path := filepath.Join(dir, fmt.Sprintf("try%d", try), "leases.db")
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			t.Fatal(err)
		}
		told, _ := writeAndKill(t, path, 1, 200)
		b, err := os.ReadFile(path + JournalSuffix)
		if err != nil {
			t.Fatalf("journal after the kill: %v; want entries", err)
		}
		if starts, _ := vouchedEntries(b); len(starts) >= 2 {
			return path, told
		}
	}
	t.Fatalf("%d writers killed after 200 writes each left journals of fewer than two entries: each checkpointed just before its kill", tries)
	return "", nil
}

// holds opens path and checks that it holds every write told (it leaves
// the journal as Open left it).
func holds(t *testing.T, path string, told map[int]string) *Store {
	t.Helper()
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	for i, id := range told {
		if r, ok, err := s.Get(i); err != nil || !ok || r.LeaseID != id {
			t.Fatalf("slot %d: %v %v %v, want lease %s", i, r.LeaseID, ok, err, id)
		}
	}
	return s
}

func TestJournalTornTailIsDropped(t *testing.T) {
	for _, tc := range []struct {
		name string
		tail []byte
	}{
		// What a write cut by a kill leaves: a header, part of its payload.
		{"cut", entryBytes(100, 0xdeadbeef, 40)},
		{"header cut", entryBytes(100, 0, 0)[:5]},
		// A power loss: the whole length, not the bytes the checksum says.
		{"wrong checksum", entryBytes(40, 0xdeadbeef, 40)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path, told := killedStore(t, t.TempDir())
			jpath := path + JournalSuffix
			st, err := os.Stat(jpath)
			if err != nil {
				t.Fatal(err)
			}
			whole := st.Size()
			f, err := os.OpenFile(jpath, os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.Write(tc.tail); err != nil {
				t.Fatal(err)
			}
			f.Close()

			s := holds(t, path, told)
			if s.Opened().Replayed == 0 {
				t.Fatal("nothing replayed")
			}
			// Past the header's reach: no writer was told of it.
			if l := s.Opened().JournalLoss; l != nil {
				t.Fatalf("a torn entry past the journal's reach reported lost: %+v", l)
			}
			if st, err := os.Stat(jpath); err != nil || st.Size() != whole {
				t.Fatalf("journal after Open: %v bytes (%v), want the %d bytes of its whole entries", st.Size(), err, whole)
			}
			// The next write follows the last whole entry, and replays.
			if err := s.Put(context.Background(), leased(9000, "ci", "after")); err != nil {
				t.Fatal(err)
			}
			abandon(t, s)
			s = holds(t, path, told)
			if _, ok, _ := s.Get(9000); !ok || s.Opened().Replayed == 0 {
				t.Fatalf("the write after the torn entry: found %v, %d changes replayed", ok, s.Opened().Replayed)
			}
			checkRequestIndex(t, s)
		})
	}
}

// abandon closes s as a kill would leave it: the files as they are, the
// journal not checkpointed.
func abandon(t *testing.T, s *Store) {
	t.Helper()
	s.stopOnce.Do(func() {
		close(s.stopLoop)
		<-s.loopDone
	})
	s.life.Lock()
	defer s.life.Unlock()
	s.closed = true
	if err := s.jnl.close(); err != nil {
		t.Fatal(err)
	}
	if err := s.db.Close(); err != nil {
		t.Fatal(err)
	}
}

// entryBytes is an entry's header (payload length n, checksum crc) and
// size bytes of payload.
func entryBytes(n, crc uint32, size int) []byte {
	b := binary.LittleEndian.AppendUint32(nil, n)
	b = binary.LittleEndian.AppendUint32(b, crc)
	return append(b, make([]byte, size)...)
}

func TestDamagedJournalGivesCorruptError(t *testing.T) {
	path, _ := killedStore(t, t.TempDir())
	jpath := path + JournalSuffix
	b, err := os.ReadFile(jpath)
	if err != nil {
		t.Fatal(err)
	}
	b[headerLen+entryHeader+3] ^= 0x40 // inside the first entry's payload: more entries follow
	if err := os.WriteFile(jpath, b, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = Open(path, Options{})
	var ce *CorruptError
	if !errors.As(err, &ce) || ce.Path != jpath || !strings.Contains(err.Error(), fmt.Sprintf("offset %d", headerLen)) {
		t.Fatalf("Open with a damaged first entry: %v, want a *CorruptError naming %s at offset %d", err, jpath, headerLen)
	}
	// Moved aside, the file and its journal go together, and a fresh
	// store opens in their place.
	aside, err := MoveAside(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{aside, aside + JournalSuffix} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("moved aside: %v", err)
		}
	}
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if recs, err := s.Load(); err != nil || len(recs) != 0 || !s.Opened().Fresh || s.Opened().OrphanJournal != "" {
		t.Fatalf("after MoveAside: %d records (%v), opened %+v; want a fresh empty store", len(recs), err, s.Opened())
	}
}

func TestJournalOfAMissingFileIsSetAside(t *testing.T) {
	path, _ := killedStore(t, t.TempDir())
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	o := s.Opened()
	if !o.Fresh || o.Replayed != 0 || !strings.HasPrefix(o.OrphanJournal, path+JournalSuffix+".orphan-") {
		t.Fatalf("opened %+v; want a fresh store, nothing replayed, the old journal set aside", o)
	}
	if recs, err := s.Load(); err != nil || len(recs) != 0 {
		t.Fatalf("a fresh store brought back %d records of the file that is gone (%v)", len(recs), err)
	}
	if _, err := os.Stat(o.OrphanJournal); err != nil {
		t.Fatal(err)
	}
}

func TestCloseCheckpointsTheJournal(t *testing.T) {
	path, told := killedStore(t, t.TempDir())
	// The killed store's last writes are in its journal alone: Close must
	// carry them, and one more, into the file.
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if s.Opened().Replayed == 0 {
		t.Fatal("nothing replayed")
	}
	if err := s.Put(context.Background(), leased(7000, "ci", "last")); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(path + JournalSuffix); err != nil || st.Size() != headerLen {
		t.Fatalf("journal after Close: %v, %v; want its header alone", st, err)
	}
	s = holds(t, path, told)
	if s.Opened().Replayed != 0 {
		t.Fatalf("%d changes replayed after a clean Close", s.Opened().Replayed)
	}
	checkRequestIndex(t, s)
	if _, ok, _ := s.Get(7000); !ok {
		t.Fatal("the last write before Close is lost")
	}
}

// TestReadsDuringCheckpoints writes from 8 goroutines, each reading its
// record back after its Put, while checkpoints run as fast as they can:
// no read ever misses a write that returned, whether it finds it in the
// journal's changes or in the file.
func TestReadsDuringCheckpoints(t *testing.T) {
	s := openTemp(t)
	ctx := context.Background()
	stop := make(chan struct{})
	var checkpoints sync.WaitGroup
	checkpoints.Go(func() {
		untilClosed(stop, func() bool {
			if err := s.flush(); err != nil {
				t.Error(err)
				return false
			}
			return true
		})
	})
	var writers sync.WaitGroup
	for w := range 8 {
		writers.Go(func() {
			for k := range 200 {
				i := 1 + w*200 + k
				r := leased(i, "ci", fmt.Sprint("r", i))
				if err := s.Put(ctx, r); err != nil {
					t.Error(err)
					return
				}
				if got, ok, err := s.Get(i); err != nil || !ok || got.LeaseID != r.LeaseID {
					t.Errorf("slot %d read back after its Put: %v %v %v", i, got.LeaseID, ok, err)
					return
				}
				if got, ok, err := s.ByRequest("ci", r.RequestID); err != nil || !ok || got.Index != i {
					t.Errorf("request %s read back after its Put: %v %v %v", r.RequestID, got.Index, ok, err)
					return
				}
			}
		})
	}
	writers.Wait()
	close(stop)
	checkpoints.Wait()
	if s.checkpoints.Load() < 2 {
		t.Fatalf("%d checkpoints ran beside the writes", s.checkpoints.Load())
	}
	recs, err := s.Load()
	if err != nil || len(recs) != 1600 {
		t.Fatalf("Load: %d records (%v), want 1600", len(recs), err)
	}
	checkRequestIndex(t, s)
}

// TestJournalStaysBounded writes without a pause, so the idle checkpoint
// never comes: the bound on pending changes brings checkpoints anyway, and
// the changes held in memory never grow far past it.
func TestJournalStaysBounded(t *testing.T) {
	s := openTemp(t)
	ctx := context.Background()
	const writers, each = 4, maxPending / 2
	var peak int
	stop := make(chan struct{})
	var sampler sync.WaitGroup
	sampler.Go(func() {
		untilClosed(stop, func() bool {
			s.pmu.RLock()
			peak = max(peak, s.pending.len())
			s.pmu.RUnlock()
			time.Sleep(100 * time.Microsecond)
			return true
		})
	})
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for k := range each {
				i := 1 + w*each + k
				if err := s.Put(ctx, leased(i, "ci", fmt.Sprint("r", i))); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	sampler.Wait()
	// Two changes a Put (the record, its request): twice the bound.
	if n := s.checkpoints.Load(); n < 2 {
		t.Errorf("%d checkpoints for %d changes, want at least 2", n, 2*writers*each)
	}
	if slack := maxPending / 8; peak > maxPending+slack {
		t.Errorf("%d changes pending at the peak, want at most %d", peak, maxPending+slack)
	}
	t.Logf("%d checkpoints; at most %d changes pending", s.checkpoints.Load(), peak)
}

// TestIdleCheckpoint: once the writes pause, the checkpointer writes the
// journal's changes into the file and empties the journal by itself.
func TestIdleCheckpoint(t *testing.T) {
	s := openTemp(t)
	for i := 1; i <= 10; i++ {
		if err := s.Put(context.Background(), leased(i, "ci", fmt.Sprint("r", i))); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := os.Stat(s.jnl.path)
		if err != nil {
			t.Fatal(err)
		}
		// The checkpoint empties the journal and then the pending
		// changes: both are awaited, or the test reads between the two.
		s.pmu.RLock()
		left := s.pending.len()
		s.pmu.RUnlock()
		if s.checkpoints.Load() > 0 && st.Size() == headerLen && left == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("10 s after the writes: %d checkpoints, journal %d bytes, %d changes pending", s.checkpoints.Load(), st.Size(), left)
		}
		time.Sleep(5 * time.Millisecond)
	}
	checkRequestIndex(t, s)
}

// untilClosed runs step again and again until stop is closed or step
// returns false.
func untilClosed(stop <-chan struct{}, step func() bool) {
	for {
		select {
		case <-stop:
			return
		default:
		}
		if !step() {
			return
		}
	}
}
