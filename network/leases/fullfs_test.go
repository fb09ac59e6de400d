package leases

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// tinyTmpfs mounts a tmpfs of size bytes on a new directory, unmounted at
// cleanup: root's and 0700, as a state directory must be (a tmpfs is 1777
// unless told).
func tinyTmpfs(t *testing.T, size int) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a tmpfs")
	}
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "mode=0700,size="+strconv.Itoa(size)); err != nil {
		t.Fatalf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}

// fillFS writes a file until the filesystem is full and returns its path.
func fillFS(t *testing.T, dir string) string {
	t.Helper()
	p := filepath.Join(dir, "filler")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4096)
	for {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("filling: %v", err)
			}
			return p
		}
	}
}

func TestFullFilesystem(t *testing.T) {
	dir := tinyTmpfs(t, 1<<20)
	path := filepath.Join(dir, "leases.db")
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	committed := map[int]bool{}
	for i := 1; i <= 20; i++ {
		if err := s.Put(ctx, leased(i, "ci", fmt.Sprintf("r%d", i))); err != nil {
			t.Fatal(err)
		}
		committed[i] = true
	}
	filler := fillFS(t, dir)

	next, batch := putUntilFull(t, s, committed)
	putConcurrently(t, s, committed)
	checkExactly(t, s, committed)
	// KeepAlive-style updates in place may or may not need a new page; a
	// failed one changes nothing.
	if _, err := s.Update(ctx, 1, func(r *Record) error { r.Expires = r.Expires.Add(time.Hour); return nil }); err != nil && !errors.Is(err, ErrNoSpace) {
		t.Fatalf("Update on a full filesystem: %v", err)
	}

	// Space is back: writes work, and the file is consistent after reopen.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	recs := make([]Record, batch)
	for k := range recs {
		recs[k] = leased(next+k, "ci", fmt.Sprintf("r%d", next+k))
		committed[next+k] = true
	}
	if err := s.Put(ctx, recs...); err != nil {
		t.Fatalf("Put once space is back: %v", err)
	}
	checkExactly(t, s, committed)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = Open(path, Options{}) // runs the consistency check
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	defer s.Close()
	checkExactly(t, s, committed)
	checkRequestIndex(t, s)
}

// putUntilFull writes batches of records from index 21 on until a Put
// fails, which must be for the full filesystem: the file must grow
// (bbolt may first reuse free pages it has), and big batches make it grow
// at once. It returns the next index and the batch size.
func putUntilFull(t *testing.T, s *Store, committed map[int]bool) (next, batch int) {
	t.Helper()
	next, batch = 21, 200
	var failed error
	for range 10 {
		recs := make([]Record, batch)
		for k := range recs {
			recs[k] = leased(next+k, "ci", fmt.Sprintf("r%d", next+k))
		}
		if failed = s.Put(context.Background(), recs...); failed != nil {
			break
		}
		for k := range recs {
			committed[next+k] = true
		}
		next += batch
	}
	if !errors.Is(failed, ErrNoSpace) || !errors.Is(failed, syscall.ENOSPC) {
		t.Fatalf("Put on a full filesystem: %v, want an error matching ErrNoSpace and ENOSPC", failed)
	}
	t.Logf("on a full filesystem: %v", failed)
	return next, batch
}

// putConcurrently writes batches from 16 writers at once: each is either
// committed (and so in committed) or failed with ErrNoSpace.
func putConcurrently(t *testing.T, s *Store, committed map[int]bool) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make([]error, 16)
	for w := range errs {
		wg.Go(func() {
			recs := make([]Record, 20)
			for k := range recs {
				i := 5000 + w*20 + k
				recs[k] = leased(i, "ci", fmt.Sprintf("r%d", i))
			}
			errs[w] = s.Put(context.Background(), recs...)
		})
	}
	wg.Wait()
	for w, err := range errs {
		ok := err == nil
		if !ok && !errors.Is(err, ErrNoSpace) {
			t.Fatalf("concurrent writer %d: %v", w, err)
		}
		for k := range 20 {
			if ok {
				committed[5000+w*20+k] = true
			}
		}
	}
}

func checkExactly(t *testing.T, s *Store, want map[int]bool) {
	t.Helper()
	recs, err := s.Load()
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != len(want) {
		t.Fatalf("%d records, want %d", len(recs), len(want))
	}
	for _, r := range recs {
		if !want[r.Index] {
			t.Fatalf("slot %d recorded but its write failed", r.Index)
		}
	}
}

func TestOpenOnFullFilesystemLeavesNoFile(t *testing.T) {
	dir := tinyTmpfs(t, 256<<10)
	fillFS(t, dir)
	path := filepath.Join(dir, "leases.db")
	_, err := Open(path, Options{})
	if !errors.Is(err, ErrNoSpace) {
		t.Fatalf("Open on a full filesystem: %v, want ErrNoSpace", err)
	}
	if _, serr := os.Stat(path); !errors.Is(serr, fs.ErrNotExist) {
		t.Fatalf("a failed Open left %s behind: %v", path, serr)
	}
}
