package test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestNothingOutsideThePrefixIsTouched plants look-alikes around a daemon's
// leaked slots — names that almost parse, symlinks to namespaces that are
// not ours, a namespace of another prefix, and a bind mount that is not a
// namespace at one of our names — and checks that reclaim, fill and a clean
// stop leave every one of them exactly as it was.
func TestNothingOutsideThePrefixIsTouched(t *testing.T) {
	h := newHost(t)
	h.leak(h.prefix, 1, 20)
	other := "zq" + h.prefix[2:]
	h.leak(other, 1, 2)
	t.Cleanup(func() { h.sweep(other) })

	lookalikes := []string{
		h.prefix + "0", h.prefix + "01", h.prefix + "65", h.prefix + "1x", h.prefix + "-1",
		strings.ToUpper(h.prefix) + "2", h.prefix + "h3",
	}
	for _, name := range lookalikes {
		if err := os.WriteFile(filepath.Join(h.netnsDir, name), []byte("not a namespace"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// Symlinks with our names pointing at namespaces that are not ours.
	for i, target := range []string{filepath.Join(h.netnsDir, other+"1"), "/proc/1/ns/net"} {
		name := filepath.Join(h.netnsDir, h.prefix+[]string{"30", "31"}[i])
		if err := os.Symlink(target, name); err != nil {
			t.Fatal(err)
		}
	}
	// A bind mount that is not a namespace, at one of our slot names.
	src := filepath.Join(t.TempDir(), "data")
	if err := os.WriteFile(src, []byte("someone else's file"), 0o600); err != nil {
		t.Fatal(err)
	}
	bound := filepath.Join(h.netnsDir, h.prefix+"40")
	if err := os.WriteFile(bound, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	run(t, "mount", "--bind", src, bound)
	t.Cleanup(func() { _ = syscall.Unmount(bound, syscall.MNT_DETACH) })

	before := snapshotDir(t, h.netnsDir, h.prefix)
	otherLinks := h.links(other)

	addr := freePort(t)
	d := start(t, nil, h.args(addr, "--slots=64")...)
	d.waitReclaimed(time.Minute)
	d.signal(syscall.SIGTERM)
	if code := d.wait(30 * time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}

	after := snapshotDir(t, h.netnsDir, h.prefix)
	for name, was := range before {
		if strings.HasPrefix(name, h.prefix) && isSlotName(name, h.prefix) && was == "nsfs" {
			continue // a leaked slot: reclaimed, as it should be
		}
		if after[name] != was {
			t.Errorf("%s was %q, now %q", name, was, after[name])
		}
	}
	if got := h.links(other); !slices.Equal(got, otherLinks) {
		t.Errorf("links of the other prefix: %v, were %v", got, otherLinks)
	}
	if b, err := os.ReadFile(bound); err != nil || string(b) != "someone else's file" {
		t.Errorf("the foreign bind mount at %s was changed: %q %v", bound, b, err)
	}
	// A clean stop keeps the warm slots it made, recorded; nothing else of
	// ours is left.
	var foreign []string
	for name, was := range before {
		if !(isSlotName(name, h.prefix) && was == "nsfs") {
			foreign = append(foreign, name)
		}
	}
	h.stoppedCleanly(h.prefix, foreign)
	for name, was := range before {
		if strings.HasPrefix(name, h.prefix) && isSlotName(name, h.prefix) && was == "nsfs" {
			continue
		}
		if now := snapshotDir(t, h.netnsDir, h.prefix)[name]; now != was {
			t.Errorf("decommission changed %s: was %q, now %q", name, was, now)
		}
	}
}

// isSlotName reports whether name is <prefix><i> written canonically.
func isSlotName(name, prefix string) bool {
	s, ok := strings.CutPrefix(name, prefix)
	return ok && s != "" && s[0] != '0' && strings.Trim(s, "0123456789") == ""
}

// snapshotDir describes every entry of dir: "nsfs" for a bound namespace,
// "symlink -> target", "file <content>", "dir", or "mount <content>".
func snapshotDir(t *testing.T, dir, prefix string) map[string]string {
	t.Helper()
	out := map[string]string{}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		var st syscall.Statfs_t
		switch {
		case e.Type()&os.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			out[e.Name()] = "symlink -> " + target
		case e.IsDir():
			out[e.Name()] = "dir"
		case syscall.Statfs(p, &st) == nil && st.Type == 0x6e736673: // NSFS_MAGIC
			out[e.Name()] = "nsfs"
		default:
			b, _ := os.ReadFile(p)
			kind := "file "
			if strings.Contains(string(mounts), " "+p+" ") {
				kind = "mount "
			}
			out[e.Name()] = kind + string(b)
		}
	}
	return out
}
