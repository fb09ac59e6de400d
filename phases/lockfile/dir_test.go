package lockfile_test

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/internal/rootdir"
	"github.com/phasegate/phasegate/phases/lockfile"
)

// A lock directory another user could write is refused by Acquire,
// AcquireCIDR and Probe, and nothing is made in it: whoever can write it
// could take the lock first. A missing one is made 0700.
func TestLockDirOnlyRootControls(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to make a directory of another user")
	}
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		mode os.FileMode
		uid  int
		why  string
	}{
		{"world-writable", 0o777, 0, rootdir.WhyOthersWritable},
		{"world-writable and sticky, as /run/lock", os.ModeSticky | 0o777, 0, rootdir.WhyOthersWritable},
		{"group-writable", 0o770, 0, rootdir.WhyGroupWritable},
		{"nobody's", 0o755, 65534, rootdir.WhyNotRoot},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "locks")
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(dir, tc.uid, tc.uid); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(dir, tc.mode); err != nil {
				t.Fatal(err)
			}
			refused := func(what string, err error) {
				t.Helper()
				var unsafe *rootdir.UnsafeError
				if !errors.As(err, &unsafe) || unsafe.Why != tc.why || unsafe.Path != dir {
					t.Errorf("%s in a %s lock directory = %v, want it refused: %s", what, tc.name, err, tc.why)
				}
			}
			l, err := lockfile.Acquire(ctx, filepath.Join(dir, "slots.lock"), 0)
			refused("Acquire", err)
			l.Unlock()
			l, err = lockfile.AcquireCIDR(ctx, dir, "neta", netip.MustParsePrefix("10.9.0.0/24"))
			refused("AcquireCIDR", err)
			l.Unlock()
			_, _, err = lockfile.Probe(ctx, filepath.Join(dir, "slots.lock"))
			refused("Probe", err)
			if ents, _ := os.ReadDir(dir); len(ents) != 0 {
				t.Errorf("made in the refused directory: %v", ents)
			}
		})
	}
	made := filepath.Join(t.TempDir(), "locks")
	l, err := lockfile.Acquire(ctx, filepath.Join(made, "slots.lock"), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unlock()
	if fi, err := os.Stat(made); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("made lock directory %v, %v; want 0700", fi.Mode(), err)
	}
}

// A lock file that is a link (left in the directory by root) is refused,
// not followed: its target is not created, locked or truncated.
func TestLockFileLinkIsNotFollowed(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	target := filepath.Join(t.TempDir(), "target")
	if err := os.WriteFile(target, []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, to := range map[string]string{"slots.lock": target, "cidrs.lock": target, "dangling.lock": filepath.Join(dir, "nowhere")} {
		if err := os.Symlink(to, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"slots.lock", "dangling.lock"} {
		if l, err := lockfile.Acquire(ctx, filepath.Join(dir, name), 0); !errors.Is(err, syscall.ELOOP) {
			l.Unlock()
			t.Errorf("Acquire of link %s = %v, want it refused", name, err)
		}
		if _, _, err := lockfile.Probe(ctx, filepath.Join(dir, name)); !errors.Is(err, syscall.ELOOP) {
			t.Errorf("Probe of link %s = %v, want it refused", name, err)
		}
	}
	if l, err := lockfile.AcquireCIDR(ctx, dir, "neta", netip.MustParsePrefix("10.9.0.0/24")); !errors.Is(err, syscall.ELOOP) {
		l.Unlock()
		t.Errorf("AcquireCIDR beside a linked guard = %v, want it refused", err)
	}
	if b, err := os.ReadFile(target); err != nil || string(b) != "keep" {
		t.Errorf("the target changed: %q, %v", b, err)
	}
	if fi, err := os.Stat(target); err != nil || fi.Mode().Perm() != 0o644 {
		t.Errorf("the target's mode changed: %v, %v", fi.Mode(), err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "nowhere")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("made through the dangling link: %v", err)
	}
}

// A lock an older build handed over from where it kept its locks is
// adopted and said to be there; a descriptor of neither file is not.
func TestAdoptFromAFormerPath(t *testing.T) {
	ctx := context.Background()
	former := filepath.Join(t.TempDir(), "old", "slots.lock")
	path := filepath.Join(t.TempDir(), "new", "slots.lock")
	old, err := lockfile.Acquire(ctx, former, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Unlock()
	fd, err := unix.Dup(int(old.File().Fd()))
	if err != nil {
		t.Fatal(err)
	}
	l, at, err := lockfile.Adopt(os.NewFile(uintptr(fd), former), path, former)
	if err != nil || at != former {
		t.Fatalf("Adopt of a lock at a former path: at %q, %v; want at %s", at, err, former)
	}
	defer l.Unlock()
	fd, err = unix.Dup(int(old.File().Fd()))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := lockfile.Adopt(os.NewFile(uintptr(fd), former), path); err == nil {
		t.Error("a lock at a path not offered was adopted")
	}
}
