package index_test

import (
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/phasegate/phasegate/network/index"
)

func TestAcquireRelease(t *testing.T) {
	s, err := index.New(5, []int{2, 4, 4})
	if err != nil {
		t.Fatal(err)
	}
	var got []int
	for {
		i, err := s.Acquire()
		if errors.Is(err, index.ErrExhausted) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, i)
	}
	if !slices.Equal(got, []int{1, 3, 5}) {
		t.Errorf("acquired %v, want [1 3 5] (quarantined 2 and 4 never handed out)", got)
	}
	if err := s.Release(3); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(3); !errors.Is(err, index.ErrNotAcquired) {
		t.Errorf("double release = %v", err)
	}
	if err := s.Release(2); !errors.Is(err, index.ErrNotAcquired) {
		t.Errorf("release of quarantined = %v", err)
	}
	for _, bad := range []int{0, 6, -1} {
		if err := s.Release(bad); !errors.Is(err, index.ErrOutOfRange) {
			t.Errorf("Release(%d) = %v", bad, err)
		}
	}
	if i, _ := s.Acquire(); i != 3 {
		t.Errorf("reacquired %d, want 3", i)
	}
	if _, err := index.New(3, []int{4}); !errors.Is(err, index.ErrOutOfRange) {
		t.Errorf("New with out-of-range quarantine = %v", err)
	}
	if _, err := index.New(0, nil); err == nil {
		t.Errorf("New(0) accepted")
	}
}

func TestQuarantine(t *testing.T) {
	s, _ := index.New(4, []int{3})
	if got := s.Quarantined(); !slices.Equal(got, []int{3}) {
		t.Errorf("Quarantined = %v", got)
	}
	i, _ := s.Acquire() // 1
	if err := s.Quarantine(i); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(i); !errors.Is(err, index.ErrNotAcquired) {
		t.Errorf("release of quarantined = %v", err)
	}
	if !s.QuarantineIfFree(2) || s.QuarantineIfFree(2) || s.QuarantineIfFree(1) {
		t.Errorf("QuarantineIfFree wrong")
	}
	snap := s.Snapshot()
	if snap.Free != 1 || snap.Quarantined != 3 || snap.Acquired != 0 ||
		!slices.Equal(snap.States, []index.State{index.Quarantined, index.Quarantined, index.Quarantined, index.Free}) {
		t.Errorf("snapshot = %+v", snap)
	}
	if j, _ := s.Acquire(); j != 4 {
		t.Errorf("acquired %d, want 4", j)
	}
	if _, err := s.Acquire(); !errors.Is(err, index.ErrExhausted) {
		t.Errorf("acquire = %v, want exhausted", err)
	}
	for _, q := range []int{1, 2, 3} {
		if err := s.Free(q); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Free(1); !errors.Is(err, index.ErrNotQuarantined) {
		t.Errorf("double free = %v", err)
	}
	if st, _ := s.State(2); st != index.Free || st.String() != "free" {
		t.Errorf("State(2) = %v", st)
	}
	if _, err := s.State(9); !errors.Is(err, index.ErrOutOfRange) {
		t.Errorf("State(9) = %v", err)
	}
}

func TestConcurrent(t *testing.T) {
	const n = 1000
	s, _ := index.New(n, nil)
	var wg sync.WaitGroup
	var mu sync.Mutex
	held := map[int]bool{}
	for range 8 {
		wg.Go(func() {
			for k := range 2000 {
				i, err := s.Acquire()
				if err != nil {
					continue
				}
				mu.Lock()
				if held[i] {
					t.Errorf("index %d handed out twice", i)
				}
				held[i] = true
				mu.Unlock()
				if k%7 == 0 {
					_ = s.Quarantine(i)
					mu.Lock()
					delete(held, i)
					mu.Unlock()
					_ = s.Free(i)
					continue
				}
				mu.Lock()
				delete(held, i)
				mu.Unlock()
				if err := s.Release(i); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if snap := s.Snapshot(); snap.Free != n {
		t.Errorf("free = %d after all released", snap.Free)
	}
}

func BenchmarkAcquireRelease(b *testing.B) {
	s, _ := index.New(16384, nil)
	for b.Loop() {
		i, _ := s.Acquire()
		_ = s.Release(i)
	}
}
