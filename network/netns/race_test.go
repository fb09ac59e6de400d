package netns_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/network/internal/nettest"
	"github.com/phasegate/phasegate/network/netns"
)

// swapper renames, over and over, a fresh entry made by one of makers over
// path, until stop is called. Each maker makes its entry at tmp; a nil maker
// removes whatever is at path instead (an unlink, which fails on a mount
// point), so that the name is free for a moment.
func swapper(t *testing.T, path string, makers ...func(tmp string) error) (stop func() int) {
	t.Helper()
	tmp := path + ".swap"
	done := make(chan struct{})
	var wg sync.WaitGroup
	var swaps atomic.Int64
	wg.Go(func() {
		for k := 0; ; k++ {
			select {
			case <-done:
				return
			default:
			}
			make := makers[k%len(makers)]
			if make == nil {
				_ = unix.Unlink(path)
				continue
			}
			_ = os.Remove(tmp)
			if err := make(tmp); err != nil {
				t.Errorf("swapper: %v", err)
				return
			}
			if err := unix.Rename(tmp, path); err == nil {
				swaps.Add(1)
			}
		}
	})
	return func() int {
		close(done)
		wg.Wait()
		_ = os.Remove(tmp)
		return int(swaps.Load())
	}
}

// outsideNamespace binds a namespace in a directory of its own, outside the
// test's netns directory, and returns its path.
func outsideNamespace(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "outside")
	t.Cleanup(func() {
		_ = netns.Delete(context.Background(), dir, "ns")
		for unix.Unmount(dir, unix.MNT_DETACH) == nil {
		}
	})
	p, err := netns.Create(context.Background(), dir, "ns")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// The name alternates between a placeholder and a symlink to a namespace
// bound outside the directory. Nothing is ever bound in the directory, so
// Inspect must never say Bound, and Stat and Open must never succeed: what
// they would see is the outside namespace, reached through the symlink.
// Before the descriptor-based Inspect, an lstat that saw the placeholder
// followed by a statfs that followed the symlink said Bound.
func TestInspectOpenRaceSymlinkSwap(t *testing.T) {
	dir, prefix := setup(t)
	if err := netns.PrepareDir(dir); err != nil {
		t.Fatal(err)
	}
	outside := outsideNamespace(t)
	outsideID, err := netns.Stat(outside)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, prefix+"1")
	stop := swapper(t, path,
		func(tmp string) error { return os.WriteFile(tmp, nil, 0) },
		func(tmp string) error { return os.Symlink(outside, tmp) },
	)
	var bound, opened, stated int
	const rounds = 20000
	for range rounds {
		if st, err := netns.Inspect(path); err == nil && st == netns.Bound {
			bound++
		}
		if id, err := netns.Stat(path); err == nil {
			stated++
			if id == outsideID {
				t.Errorf("Stat returned the outside namespace")
			}
		}
		if fd, err := netns.Open(path); err == nil {
			opened++
			var st unix.Stat_t
			if unix.Fstat(fd, &st) == nil && st.Ino == outsideID.Ino && st.Dev == outsideID.Dev {
				t.Errorf("Open opened the outside namespace")
			}
			unix.Close(fd)
		}
	}
	swaps := stop()
	t.Logf("%d swaps during %d rounds", swaps, rounds)
	if swaps < 100 {
		t.Fatalf("only %d swaps: the race was not exercised", swaps)
	}
	if bound+stated+opened > 0 {
		t.Errorf("with only a placeholder and a symlink at %s: Inspect said Bound %d times, Stat succeeded %d, Open %d",
			path, bound, stated, opened)
	}
	if !netns.IsMounted(outside) {
		t.Errorf("the outside namespace was unmounted")
	}
}

// A symlink to a file outside the directory is renamed over the name again
// and again while Create runs. A path-based bind mount follows the symlink
// and binds the namespace onto the outside file; Create binds onto its own
// placeholder's descriptor, so nothing outside is ever mounted on. A file
// with content is swapped in too: Create must never remove it.
func TestCreateRaceSymlinkSwap(t *testing.T) {
	dir, prefix := setup(t)
	if err := netns.PrepareDir(dir); err != nil {
		t.Fatal(err)
	}
	outside := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(outside, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for unix.Unmount(outside, unix.MNT_DETACH) == nil {
		}
	})
	ctx := context.Background()
	name := prefix + "1"
	path := filepath.Join(dir, name)
	stop := swapper(t, path,
		nil,
		func(tmp string) error { return os.Symlink(outside, tmp) },
		nil,
		func(tmp string) error { return os.WriteFile(tmp, []byte("someone's"), 0o600) },
	)
	var made, failed int
	const rounds = 1000
	for range rounds {
		if _, err := netns.Create(ctx, dir, name); err == nil {
			made++
		} else {
			failed++
		}
		// Delete ours if it is there; a look-alike swapped in stays.
		if err := netns.Delete(ctx, dir, name); err != nil && !errors.Is(err, netns.ErrNotNamespace) {
			t.Errorf("Delete: %v", err)
		}
		if mountedOn(t, outside) {
			break
		}
	}
	swaps := stop()
	t.Logf("%d creates, %d failed, %d swaps", made, failed, swaps)
	if swaps < 100 {
		t.Fatalf("only %d swaps: the race was not exercised", swaps)
	}
	if mountedOn(t, outside) {
		t.Fatalf("a namespace was bound onto %s, outside the directory", outside)
	}
	if fi, err := os.Lstat(outside); err != nil || !fi.Mode().IsRegular() || fi.Size() != 0 {
		t.Errorf("the outside file changed: %v %v", fi, err)
	}
	_ = netns.Delete(ctx, dir, name)
	_ = os.Remove(path) // whatever the swapper left
	if ms := nettest.Mounts(t, dir); len(ms) != 0 {
		t.Errorf("mounts left in the directory: %v", ms)
	}
}

func mountedOn(t *testing.T, path string) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 4 && f[4] == path {
			return true
		}
	}
	return false
}
