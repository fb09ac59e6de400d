package netns_test

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/internal/leakcheck"
	"github.com/phasegate/phasegate/network/internal/nettest"
	"github.com/phasegate/phasegate/network/netns"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

func setup(t *testing.T) (dir, prefix string) {
	t.Helper()
	env := nettest.New(t, 8)
	return env.Config.NetnsDir, env.Config.Prefix
}

// scanProcesses is netns.ScanProcesses for tests: processes this test may
// not read (a sandbox's init, say) are logged, not fatal; the rest of the
// map is right.
func scanProcesses(t *testing.T) (netns.Processes, error) {
	t.Helper()
	procs, err := netns.ScanProcesses()
	var inc *netns.IncompleteError
	if errors.As(err, &inc) {
		t.Logf("scan: %v", err)
		return procs, nil
	}
	return procs, err
}

func assertGone(t *testing.T, dir, name string) {
	t.Helper()
	if _, err := os.Lstat(filepath.Join(dir, name)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("%s still exists (err=%v)", name, err)
	}
	for _, m := range nettest.Mounts(t, dir) {
		if strings.Contains(m, "/"+name+" ") {
			t.Errorf("still mounted: %s", m)
		}
	}
}

func TestValidateName(t *testing.T) {
	for _, bad := range []string{"", ".", "..", "a/b", "../x", "a\x00b", strings.Repeat("x", 256)} {
		if err := netns.ValidateName(bad); !errors.Is(err, netns.ErrInvalidName) {
			t.Errorf("ValidateName(%q) = %v, want ErrInvalidName", bad, err)
		}
	}
	for _, good := range []string{"pg-1", "a", "x..y", strings.Repeat("x", 255)} {
		if err := netns.ValidateName(good); err != nil {
			t.Errorf("ValidateName(%q) = %v", good, err)
		}
	}
	// Invalid names never reach the file system.
	if _, err := netns.Create(context.Background(), "/nonexistent", "../etc"); !errors.Is(err, netns.ErrInvalidName) {
		t.Errorf("Create(../etc) = %v", err)
	}
	if err := netns.Delete(context.Background(), "/nonexistent", "a/b"); !errors.Is(err, netns.ErrInvalidName) {
		t.Errorf("Delete(a/b) = %v", err)
	}
}

func TestCreateDelete(t *testing.T) {
	dir, prefix := setup(t)
	ctx := context.Background()
	name := prefix + "1"
	path, err := netns.Create(ctx, dir, name)
	if err != nil {
		t.Fatal(err)
	}
	if path != filepath.Join(dir, name) {
		t.Errorf("path = %q", path)
	}
	id, err := netns.Stat(path)
	if err != nil {
		t.Fatalf("Stat: %v", err)
	}
	// The creating thread exits with its goroutine (asynchronously): soon
	// no thread of this process may be left inside the new namespace.
	for try := 0; ; try++ {
		procs, err := scanProcesses(t)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(procs[id], os.Getpid()) {
			break
		}
		if try == 200 {
			t.Fatalf("a thread of this process stays inside the new namespace")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := netns.Create(ctx, dir, name); !errors.Is(err, fs.ErrExist) {
		t.Errorf("second Create = %v, want ErrExist", err)
	}
	if ms := nettest.Mounts(t, dir); len(ms) != 1 {
		t.Errorf("mounts after create: %v", ms)
	}
	ents, err := netns.List(dir, prefix)
	if err != nil || len(ents) != 1 || ents[0].Name != name || ents[0].Kind != netns.KindFile {
		t.Errorf("List = %v, %v", ents, err)
	}
	if err := netns.Delete(ctx, dir, name); err != nil {
		t.Fatal(err)
	}
	assertGone(t, dir, name)
	if err := netns.Delete(ctx, dir, name); err != nil {
		t.Errorf("second Delete = %v, want nil", err)
	}
}

func TestCreateLeavesNoDescriptor(t *testing.T) {
	dir, prefix := setup(t)
	count := func() int {
		ents, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, e := range ents {
			if target, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil &&
				(strings.HasPrefix(target, dir) || strings.HasPrefix(target, "net:")) {
				n++
			}
		}
		return n
	}
	before := count()
	for i := range 5 {
		if _, err := netns.Create(context.Background(), dir, prefix+string(rune('a'+i))); err != nil {
			t.Fatal(err)
		}
	}
	if after := count(); after != before {
		t.Errorf("descriptors on the netns dir or namespaces: before %d, after %d", before, after)
	}
}

func TestDeleteNeverFollowsSymlinksOrDirs(t *testing.T) {
	dir, prefix := setup(t)
	ctx := context.Background()
	target, err := netns.Create(ctx, dir, prefix+"target")
	if err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, prefix+"link")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	sub := filepath.Join(dir, prefix+"dir")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{prefix + "link", prefix + "dir"} {
		if err := netns.Delete(ctx, dir, n); !errors.Is(err, netns.ErrNotNamespace) {
			t.Errorf("Delete(%s) = %v, want ErrNotNamespace", n, err)
		}
	}
	if _, err := os.Lstat(link); err != nil {
		t.Errorf("symlink removed: %v", err)
	}
	if _, err := os.Stat(sub); err != nil {
		t.Errorf("directory removed: %v", err)
	}
	if !netns.IsMounted(target) {
		t.Errorf("symlink target was unmounted")
	}
	ents, _ := netns.List(dir, prefix)
	kinds := map[string]netns.Kind{}
	for _, e := range ents {
		kinds[e.Name] = e.Kind
	}
	if kinds[prefix+"link"] != netns.KindSymlink || kinds[prefix+"dir"] != netns.KindDir || kinds[prefix+"target"] != netns.KindFile {
		t.Errorf("List kinds = %v", kinds)
	}
}

// Two mounts stacked on one file: the first detach leaves a mount point, so
// unlink answers EBUSY; Delete detaches again and succeeds.
func TestDeleteRetriesBusy(t *testing.T) {
	dir, prefix := setup(t)
	ctx := context.Background()
	path, err := netns.Create(ctx, dir, prefix+"1")
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := unix.Mount(path, path, "none", unix.MS_BIND, ""); err != nil {
			t.Fatal(err)
		}
	}
	if err := netns.Delete(ctx, dir, prefix+"1"); err != nil {
		t.Fatalf("Delete with stacked mounts: %v", err)
	}
	assertGone(t, dir, prefix+"1")
}

// What hashicorp/nomad PR #25714 fixed: one process holds a descriptor on
// the netns file, another lives inside the namespace, and the namespace is
// deleted.
func TestDeleteWhileHeld(t *testing.T) {
	dir, prefix := setup(t)
	ctx := context.Background()
	path, err := netns.Create(ctx, dir, prefix+"1")
	if err != nil {
		t.Fatal(err)
	}
	id, _ := netns.Stat(path)
	holder := nettest.StartHolder(t, path)
	inside := nettest.StartInside(t, path)
	procs, err := scanProcesses(t)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(procs[id], inside.Process.Pid) {
		t.Errorf("ScanProcesses did not find pid %d inside: %v", inside.Process.Pid, procs[id])
	}
	if slices.Contains(procs[id], holder.Process.Pid) {
		t.Errorf("the descriptor holder is not inside the namespace")
	}
	if got := netns.Comm(inside.Process.Pid); got != "sleep" {
		t.Errorf("Comm = %q", got)
	}
	if err := netns.Delete(ctx, dir, prefix+"1"); err != nil {
		t.Fatalf("Delete while held: %v", err)
	}
	assertGone(t, dir, prefix+"1")
}

func TestIPInterop(t *testing.T) {
	env := nettest.New(t, 8)
	dir, prefix := env.Config.NetnsDir, env.Config.Prefix
	ctx := context.Background()

	// Ours, seen and used by ip.
	if _, err := netns.Create(ctx, dir, prefix+"1"); err != nil {
		t.Fatal(err)
	}
	out, err := env.IP(t, "netns", "list")
	if err != nil || !strings.Contains(out, prefix+"1") {
		t.Fatalf("ip netns list: %v\n%s", err, out)
	}
	out, err = env.IP(t, "netns", "exec", prefix+"1", "ip", "-o", "link", "show")
	if err != nil || !strings.Contains(out, "lo:") || strings.Count(out, "\n") != 1 {
		t.Fatalf("ip netns exec: %v\n%s", err, out)
	}

	// ip's, deleted by us.
	if out, err := env.IP(t, "netns", "add", prefix+"2"); err != nil {
		t.Fatalf("ip netns add: %v\n%s", err, out)
	}
	if !netns.IsMounted(filepath.Join(dir, prefix+"2")) {
		t.Fatalf("ip netns add did not propagate to %s: %v", dir, nettest.Mounts(t, dir))
	}
	if err := netns.Delete(ctx, dir, prefix+"2"); err != nil {
		t.Fatal(err)
	}
	assertGone(t, dir, prefix+"2")

	// And ip deletes ours.
	if out, err := env.IP(t, "netns", "delete", prefix+"1"); err != nil {
		t.Fatalf("ip netns delete: %v\n%s", err, out)
	}
	assertGone(t, dir, prefix+"1")
}

func TestPrepareDirIdempotent(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ns")
	t.Cleanup(func() {
		for unix.Unmount(dir, unix.MNT_DETACH) == nil {
		}
	})
	nettest.RequireRoot(t)
	for range 3 {
		if err := netns.PrepareDir(dir); err != nil {
			t.Fatal(err)
		}
	}
	b, _ := os.ReadFile("/proc/self/mountinfo")
	n := 0
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 6 && f[4] == dir {
			n++
			if !strings.Contains(l, "shared:") {
				t.Errorf("dir mount not shared: %s", l)
			}
		}
	}
	if n != 1 {
		t.Errorf("dir mounted %d times, want 1", n)
	}
	if err := netns.PrepareDir("relative"); err == nil {
		t.Errorf("relative dir accepted")
	}
}

// Look-alikes at our names are never touched: a bind mount of someone's
// file, a file with content. A placeholder (an empty regular file, whatever
// its mode) is ours: mode 0 is what Create and iproute2 make before binding;
// mode 0644 is what a namespace made over an os.Create'd file leaves when a
// Delete is killed between its unmount and its unlink.
func TestForeignFilesUntouched(t *testing.T) {
	dir, prefix := setup(t)
	ctx := context.Background()
	src := filepath.Join(t.TempDir(), "data")
	if err := os.WriteFile(src, []byte("someone else's file"), 0o600); err != nil {
		t.Fatal(err)
	}
	bound := filepath.Join(dir, prefix+"40")
	if err := os.WriteFile(bound, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(src, bound, "none", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(bound, unix.MNT_DETACH) })
	content := filepath.Join(dir, prefix+"41")
	if err := os.WriteFile(content, []byte("not a namespace"), 0o600); err != nil {
		t.Fatal(err)
	}
	placeholder := filepath.Join(dir, prefix+"42")
	if err := os.WriteFile(placeholder, nil, 0); err != nil {
		t.Fatal(err)
	}
	interrupted := filepath.Join(dir, prefix+"43")
	if err := os.WriteFile(interrupted, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("/proc/thread-self/ns/net", interrupted, "none", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	if st, err := netns.Inspect(interrupted); err != nil || st != netns.Bound {
		t.Fatalf("Inspect(bound 0644 file) = %v, %v; want Bound", st, err)
	}
	// The first half of a Delete, as a kill -9 would leave it.
	if err := unix.Unmount(interrupted, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{bound, content} {
		if st, err := netns.Inspect(p); !errors.Is(err, netns.ErrNotNamespace) {
			t.Errorf("Inspect(%s) = %v, %v; want ErrNotNamespace", p, st, err)
		}
		if err := netns.Delete(ctx, dir, filepath.Base(p)); !errors.Is(err, netns.ErrNotNamespace) {
			t.Errorf("Delete(%s) = %v, want ErrNotNamespace", p, err)
		}
	}
	if b, err := os.ReadFile(bound); err != nil || string(b) != "someone else's file" {
		t.Errorf("the foreign bind mount was changed: %q %v", b, err)
	}
	if b, err := os.ReadFile(content); err != nil || string(b) != "not a namespace" {
		t.Errorf("the foreign file was changed: %q %v", b, err)
	}
	for _, name := range []string{prefix + "42", prefix + "43"} {
		p := filepath.Join(dir, name)
		if st, err := netns.Inspect(p); err != nil || st != netns.Placeholder {
			t.Errorf("Inspect(%s) = %v, %v; want Placeholder", name, st, err)
		}
		if err := netns.Delete(ctx, dir, name); err != nil {
			t.Errorf("Delete(%s) = %v", name, err)
		}
		assertGone(t, dir, name)
	}
	if st, err := netns.Inspect(placeholder); err != nil || st != netns.Missing {
		t.Errorf("Inspect(gone) = %v, %v", st, err)
	}
}

// PathID is the identity of the namespace bound at a path, as Stat says;
// a symlink to it, a placeholder or a missing file never has that identity.
func TestPathID(t *testing.T) {
	dir, prefix := setup(t)
	ctx := context.Background()
	path, err := netns.Create(ctx, dir, prefix+"1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netns.Delete(context.Background(), dir, prefix+"1") })
	want, err := netns.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, prefix+"2")
	if err := os.Symlink(path, link); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(link) })
	placeholder := filepath.Join(dir, prefix+"3")
	if err := os.WriteFile(placeholder, nil, 0o444); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(placeholder) })
	tests := []struct {
		name, path string
		same, err  bool
	}{
		{"bound namespace", path, true, false},
		{"symlink to it: not followed", link, false, false},
		{"placeholder", placeholder, false, false},
		{"missing", filepath.Join(dir, prefix+"4"), false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := netns.PathID(tt.path)
			if (err != nil) != tt.err {
				t.Fatalf("PathID(%s) error %v, want error: %v", tt.path, err, tt.err)
			}
			if (got == want) != tt.same {
				t.Errorf("PathID(%s) = %+v, Stat of the namespace %+v: same %v, want %v", tt.path, got, want, got == want, tt.same)
			}
		})
	}
}
