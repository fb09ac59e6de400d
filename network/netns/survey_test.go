package netns_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/network/netns"
)

// Survey must say, for every kind of entry, what Inspect says of it.
func TestSurveyAgreesWithInspect(t *testing.T) {
	dir, prefix := setup(t)
	ctx := context.Background()
	want := makeEveryKindOfEntry(t, ctx, dir, prefix)

	found, err := netns.Survey(dir, func(name string) bool { return strings.HasPrefix(name, prefix) })
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, f := range found {
		seen[f.Name] = true
		st, ierr := netns.Inspect(filepath.Join(dir, f.Name))
		if f.State != st || errors.Is(f.Err, netns.ErrNotNamespace) != errors.Is(ierr, netns.ErrNotNamespace) || (f.Err == nil) != (ierr == nil) {
			t.Errorf("%q: Survey says %v, %v; Inspect says %v, %v", f.Name, f.State, f.Err, st, ierr)
		}
		// A bound namespace's identity is the one Stat gives, read from
		// mountinfo: a namespace made again under the name is told apart.
		if id, serr := netns.Stat(filepath.Join(dir, f.Name)); f.State == netns.Bound && (serr != nil || f.ID != id || id.Ino == 0) {
			t.Errorf("%q: Survey says namespace %+v, Stat says %+v (%v)", f.Name, f.ID, id, serr)
		} else if f.State != netns.Bound && f.ID != (netns.ID{}) {
			t.Errorf("%q: Survey gives %v an identity %+v", f.Name, f.State, f.ID)
		}
		if w, ours := want[f.Name]; ours {
			if f.Err != nil || f.State != w {
				t.Errorf("%q: Survey says %v, %v; want %v", f.Name, f.State, f.Err, w)
			}
		} else if !errors.Is(f.Err, netns.ErrNotNamespace) {
			t.Errorf("%q: Survey says %v, %v; want a look-alike", f.Name, f.State, f.Err)
		}
	}
	for _, n := range []string{"bound", "with space", `back\slash`, "ph0", "ph644", "content", "symlink", "dir",
		"foreign", "foreign-empty", "uts", "ns-over-foreign", "foreign-over-ns", "stacked"} {
		if !seen[prefix+n] {
			t.Errorf("Survey did not list %q", prefix+n)
		}
	}
	if seen["other"] {
		t.Errorf("Survey listed a name match refused")
	}
	checkDeleteAgrees(t, ctx, dir, prefix, found, want)
}

// makeEveryKindOfEntry makes, in dir, one entry of every kind under
// prefix (namespaces bound, placeholders, a file with content, a symlink,
// a directory, foreign and other namespaces' mounts, stacks of mounts)
// and one name not ours; it returns the state each of ours must have
// (absent: a look-alike).
func makeEveryKindOfEntry(t *testing.T, ctx context.Context, dir, prefix string) (want map[string]netns.State) {
	t.Helper()
	p := func(name string) string { return filepath.Join(dir, prefix+name) }
	bind := func(src, dst string) {
		t.Helper()
		if err := unix.Mount(src, dst, "none", unix.MS_BIND, ""); err != nil {
			t.Fatalf("bind %s on %s: %v", src, dst, err)
		}
		t.Cleanup(func() {
			for unix.Unmount(dst, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW) == nil {
			}
		})
	}
	file := func(path string, content string, mode os.FileMode) {
		t.Helper()
		if err := os.WriteFile(path, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
	}
	src := filepath.Join(t.TempDir(), "data")
	file(src, "someone else's", 0o600)
	empty := filepath.Join(t.TempDir(), "empty")
	file(empty, "", 0o600)

	want = map[string]netns.State{} // name -> state; absent: look-alike
	for _, n := range []string{"bound", "with space", `back\slash`} {
		if _, err := netns.Create(ctx, dir, prefix+n); err != nil {
			t.Fatal(err)
		}
		want[prefix+n] = netns.Bound
	}
	file(p("ph0"), "", 0)
	file(p("ph644"), "", 0o644)
	want[prefix+"ph0"], want[prefix+"ph644"] = netns.Placeholder, netns.Placeholder
	file(p("content"), "x", 0o600)
	if err := os.Symlink(p("bound"), p("symlink")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(p("dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	file(p("foreign"), "", 0o600)
	bind(src, p("foreign"))
	file(p("foreign-empty"), "", 0o600)
	bind(empty, p("foreign-empty"))
	file(p("uts"), "", 0o600)
	bind("/proc/self/ns/uts", p("uts"))
	// Stacks: what a lookup reaches is the top. The namespace bound in
	// them is the test's own, through /proc: a bind of one of the
	// directory's (shared) mounts would make the two peers, and a mount
	// on one would propagate onto the other.
	ns := "/proc/self/ns/net"
	file(p("ns-over-foreign"), "", 0o600)
	bind(src, p("ns-over-foreign"))
	bind(ns, p("ns-over-foreign"))
	want[prefix+"ns-over-foreign"] = netns.Bound
	file(p("foreign-over-ns"), "", 0o600)
	bind(ns, p("foreign-over-ns"))
	bind(src, p("foreign-over-ns"))
	if _, err := netns.Create(ctx, dir, prefix+"stacked"); err != nil {
		t.Fatal(err)
	}
	bind(ns, p("stacked"))
	want[prefix+"stacked"] = netns.Bound
	// Not ours: not listed at all.
	file(filepath.Join(dir, "other"), "", 0)
	return want
}

// checkDeleteAgrees deletes every entry found: look-alikes stay, ours go;
// a namespace bound over a foreign mount is detached, and the foreign
// mount below it stays.
func checkDeleteAgrees(t *testing.T, ctx context.Context, dir, prefix string, found []netns.Found, want map[string]netns.State) {
	t.Helper()
	p := func(name string) string { return filepath.Join(dir, prefix+name) }
	for _, f := range found {
		err := netns.Delete(ctx, dir, f.Name)
		if f.Name == prefix+"ns-over-foreign" {
			if st, ierr := netns.Inspect(p("ns-over-foreign")); !errors.Is(err, netns.ErrNotNamespace) || !errors.Is(ierr, netns.ErrNotNamespace) {
				t.Errorf("Delete(namespace over a foreign mount) = %v, then Inspect = %v, %v; want ErrNotNamespace", err, st, ierr)
			}
			continue
		}
		if _, ours := want[f.Name]; ours && err != nil {
			t.Errorf("Delete(%q) = %v", f.Name, err)
		} else if !ours && !errors.Is(err, netns.ErrNotNamespace) {
			t.Errorf("Delete(look-alike %q) = %v, want ErrNotNamespace", f.Name, err)
		}
	}
	for _, n := range []string{"foreign", "ns-over-foreign"} {
		if b, err := os.ReadFile(p(n)); err != nil || string(b) != "someone else's" {
			t.Errorf("the foreign bind mount at %s changed: %q %v", n, b, err)
		}
	}
}

func TestSurveyMissingDir(t *testing.T) {
	found, err := netns.Survey(filepath.Join(t.TempDir(), "none"), func(string) bool { return true })
	if err != nil || len(found) != 0 {
		t.Errorf("Survey(missing dir) = %v, %v", found, err)
	}
}

// A namespace of another type bound at one of our names is someone else's.
func TestInspectOtherNamespaceType(t *testing.T) {
	dir, prefix := setup(t)
	if err := netns.PrepareDir(dir); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, prefix+"1")
	if err := os.WriteFile(path, nil, 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("/proc/self/ns/uts", path, "none", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(path, unix.MNT_DETACH) })
	if st, err := netns.Inspect(path); !errors.Is(err, netns.ErrNotNamespace) {
		t.Errorf("Inspect(uts namespace) = %v, %v; want ErrNotNamespace", st, err)
	}
	if _, err := netns.Open(path); !errors.Is(err, netns.ErrNotNamespace) {
		t.Errorf("Open(uts namespace) = %v; want ErrNotNamespace", err)
	}
	if err := netns.Delete(context.Background(), dir, prefix+"1"); !errors.Is(err, netns.ErrNotNamespace) {
		t.Errorf("Delete(uts namespace) = %v; want ErrNotNamespace", err)
	}
	if !mountedOn(t, path) {
		t.Errorf("the uts namespace was unmounted")
	}
}
