package leases

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	"github.com/phasegate/phasegate/internal/rootdir"
)

// TestLinksAreNotFollowed: a symlink where the store's file or its
// journal should be is refused by Open and MoveAside (an error matching
// ELOOP), and what it points to is neither read, created nor changed.
func TestLinksAreNotFollowed(t *testing.T) {
	for _, tc := range []struct {
		name, link string // link: the store's name the symlink takes
		dangling   bool   // the target does not exist: a create through it would make it
	}{
		{"the file, to a file", "leases.db", false},
		{"the file, dangling", "leases.db", true},
		{"the journal, to a file", "leases.db" + JournalSuffix, false},
		{"the journal, dangling", "leases.db" + JournalSuffix, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "leases.db")
			if tc.link != "leases.db" {
				// A store whose journal is then replaced by a link.
				s, err := Open(path, Options{})
				if err != nil {
					t.Fatal(err)
				}
				if err := s.Close(); err != nil {
					t.Fatal(err)
				}
				if err := os.Remove(filepath.Join(dir, tc.link)); err != nil {
					t.Fatal(err)
				}
			}
			target := filepath.Join(t.TempDir(), "target")
			if !tc.dangling {
				if err := os.WriteFile(target, []byte("not a store"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.Symlink(target, filepath.Join(dir, tc.link)); err != nil {
				t.Fatal(err)
			}
			s, err := Open(path, Options{})
			if err == nil {
				s.Close()
			}
			var link *rootdir.LinkError
			if !errors.As(err, &link) || !errors.Is(err, syscall.ELOOP) || link.Path != filepath.Join(dir, tc.link) {
				t.Fatalf("Open with %s a symlink = %v, want a LinkError naming it", tc.link, err)
			}
			if tc.link == "leases.db" {
				if _, err := MoveAside(path); !errors.Is(err, syscall.ELOOP) {
					t.Errorf("MoveAside of a symlink = %v, want it refused", err)
				}
			}
			b, err := os.ReadFile(target)
			switch {
			case tc.dangling && !errors.Is(err, os.ErrNotExist):
				t.Errorf("a file was made through the dangling link: %q, %v", b, err)
			case !tc.dangling && string(b) != "not a store":
				t.Errorf("the link's target changed: %q, %v", b, err)
			}
			if fi, err := os.Lstat(filepath.Join(dir, tc.link)); err != nil || fi.Mode()&os.ModeSymlink == 0 {
				t.Errorf("the link itself is gone or changed: %v", err)
			}
		})
	}
}

// TestOpenRefusesADirectoryOthersControl: a store is only opened in a
// directory root controls; in another, nothing is created.
func TestOpenRefusesADirectoryOthersControl(t *testing.T) {
	for _, mode := range []os.FileMode{0o777, 0o770, os.ModeSticky | 0o777} {
		t.Run(fmt.Sprintf("%v", mode), func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "state")
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(dir, mode); err != nil {
				t.Fatal(err)
			}
			s, err := Open(filepath.Join(dir, "leases.db"), Options{})
			if err == nil {
				s.Close()
			}
			var unsafe *rootdir.UnsafeError
			if !errors.As(err, &unsafe) || unsafe.Path != dir {
				t.Fatalf("Open in a %v directory = %v, want it refused naming the directory", mode, err)
			}
			if names, _ := os.ReadDir(dir); len(names) != 0 {
				t.Errorf("files created in the refused directory: %v", names)
			}
		})
	}
}

// TestRemove: the file, its journal and its pre-upgrade copies go; what
// was set aside for inspection, other stores' files and the target of a
// link named like a copy stay.
func TestRemove(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "leases.db")
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Put(context.Background(), idle(1)); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	kept := []string{"leases.db.corrupt-20261201T100000.000000000Z", "other.db", "other.db.schema2.bak", "leases.db.schemax.bak"}
	for _, n := range append([]string{"leases.db.schema2.bak", "leases.db.schema3.bak"}, kept...) {
		if err := os.WriteFile(filepath.Join(dir, n), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	target := filepath.Join(t.TempDir(), "target")
	if err := os.WriteFile(target, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, filepath.Join(dir, "leases.db.schema1.bak")); err != nil {
		t.Fatal(err)
	}
	removed, err := Remove(path)
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, n := range []string{"leases.db", "leases.db" + JournalSuffix, "leases.db.schema1.bak", "leases.db.schema2.bak", "leases.db.schema3.bak"} {
		want = append(want, filepath.Join(dir, n))
	}
	if !slices.Equal(removed, want) {
		t.Errorf("removed %v, want %v", removed, want)
	}
	ents, _ := os.ReadDir(dir)
	var left []string
	for _, e := range ents {
		left = append(left, e.Name())
	}
	slices.Sort(kept)
	if !slices.Equal(left, kept) {
		t.Errorf("left %v, want %v", left, kept)
	}
	if _, err := os.Stat(target); err != nil {
		t.Errorf("the target of a link named like a copy: %v", err)
	}
}
