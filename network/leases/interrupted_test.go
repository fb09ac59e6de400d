package leases

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"
)

// TestCloseWaitsForWrites closes the store while writers run: every write
// that returned nil is in the file afterwards, every other one returned
// ErrClosed.
func TestCloseWaitsForWrites(t *testing.T) {
	path := filepath.Join(t.TempDir(), "leases.db")
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		written = map[int]bool{}
		started = make(chan struct{})
		once    sync.Once
	)
	for w := range 8 {
		wg.Go(func() {
			for n := range 200 {
				i := 1 + w*200 + n
				err := s.Put(context.Background(), idle(i))
				once.Do(func() { close(started) })
				switch {
				case err == nil:
					mu.Lock()
					written[i] = true
					mu.Unlock()
				case errors.Is(err, ErrClosed):
					return
				default:
					t.Errorf("Put: %v", err)
					return
				}
			}
		})
	}
	<-started
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	s, err = Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	checkExactly(t, s, written)
}

// TestKillDuringWritesWithoutFsync kills a process writing records from 16
// goroutines without fsync (SyncNever, what a store on tmpfs does) with
// SIGKILL at a random instant, round after round on the same file: every
// time the file opens whole (every page walked, bbolt's check passed) and
// holds every record whose Put had returned, with its lease id.
func TestKillDuringWritesWithoutFsync(t *testing.T) {
	path := filepath.Join(t.TempDir(), "leases.db")
	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 2))
	told := map[int]string{}
	base := 1
	for round := range 8 {
		// Kill once the writers are well under way, at a random instant.
		killAt := 50 + r.IntN(400)
		got, n := writeAndKill(t, path, base, killAt)
		for i, id := range got {
			told[i] = id
			base = max(base, i+1)
		}

		s, err := Open(path, Options{})
		if err != nil {
			t.Fatalf("round %d: after kill -9 with %d writes told: %v", round, n, err)
		}
		// The writers never paused, so the journal held what the file did
		// not: its replay is what this round tests.
		if s.Opened().Replayed == 0 {
			t.Errorf("round %d: nothing replayed from the journal after a kill in the middle of writes", round)
		}
		recs, err := s.Load()
		if err != nil {
			t.Fatalf("round %d: Load: %v", round, err)
		}
		inFile := map[int]string{}
		for _, rec := range recs {
			inFile[rec.Index] = rec.LeaseID
		}
		for i, id := range told {
			if inFile[i] != id {
				t.Errorf("round %d: slot %d: Put returned with lease %s, the store after kill -9 holds %q", round, i, id, inFile[i])
			}
		}
		checkRequestIndex(t, s)
		base = max(base, len(recs)+1) + killWriters // past any write that landed untold
		for _, rec := range recs {
			base = max(base, rec.Index+1)
		}
		s.Close()
		t.Logf("round %d: killed after %d writes told; %d records, every one told there, %d changes replayed from the journal",
			round, n, len(recs), s.Opened().Replayed)
	}
}

// writeAndKill runs the helper's write mode on path from index base and
// kills it (SIGKILL) once it has told killAt writes; it returns every
// write told (index -> lease id) and how many.
func writeAndKill(t *testing.T, path string, base, killAt int) (map[int]string, int) {
	t.Helper()
	cmd := helper(t, "write", path)
	cmd.Env = append(cmd.Env, helperEnv+"_BASE="+strconv.Itoa(base))
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	told, n := map[int]string{}, 0
	for line := range lines {
		var i int
		var id string
		if _, err := fmt.Sscanf(line, "put %d %s", &i, &id); err != nil {
			t.Fatalf("the helper said %q", line)
		}
		told[i] = id
		if n++; n == killAt {
			cmd.Process.Kill()
		}
	}
	cmd.Wait()
	if n < killAt {
		t.Fatalf("the helper stopped after %d writes, before it was killed", n)
	}
	return told, n
}
