package netns

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestParseMountinfo(t *testing.T) {
	in := []byte(`22 1 0:21 / /run rw,nosuid shared:5 - tmpfs tmpfs rw
30 22 0:21 /netns /run/netns rw shared:9 - tmpfs tmpfs rw
31 30 0:4 net:[4026532281] /run/netns/pg-1 rw shared:9 - nsfs nsfs rw
32 30 0:4 net:[4026532282] /run/netns/pg-2 rw shared:9 - nsfs nsfs rw
33 32 0:4 net:[4026532283] /run/netns/pg-2 rw shared:9 - nsfs nsfs rw
34 30 254:0 /home/x/data /run/netns/pg-3 rw - ext4 /dev/vda rw
35 34 0:4 net:[4026532284] /run/netns/pg-3 rw - nsfs nsfs rw
36 30 0:4 uts:[4026531838] /run/netns/pg-4 rw - nsfs nsfs rw
37 30 0:4 net:[4026532285] /run/netns/pg\0405 rw - nsfs nsfs rw
38 22 0:4 net:[4026532286] /run/netns/pg-6 rw - nsfs nsfs rw
39 30 0:4 net:[4026532287] /run/netns/sub/pg-7 rw - nsfs nsfs rw
40 30 254:0 / /run/netns/pg-8 rw master:1 - ext4 /dev/vda rw
`)
	entries, err := parseMountinfo(in)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 12 || entries[8].point != "/run/netns/pg 5" || entries[2].root != "net:[4026532281]" {
		t.Fatalf("parsed %+v", entries)
	}
	got := visibleMounts(entries, "/run/netns", 30)
	want := map[string]mount{
		"pg-1": {"nsfs", "net:[4026532281]"},
		"pg-2": {"nsfs", "net:[4026532283]"}, // the top of the stack
		"pg-3": {"nsfs", "net:[4026532284]"}, // a namespace over a foreign mount
		"pg-4": {"nsfs", "uts:[4026531838]"},
		"pg 5": {"nsfs", "net:[4026532285]"},
		"pg-8": {"ext4", "/"},
		// pg-6: under the directory's own mount (parent 22), hidden;
		// pg-7: in a subdirectory.
	}
	if len(got) != len(want) {
		t.Errorf("visibleMounts = %v", got)
	}
	for n, w := range want {
		if got[n] != w {
			t.Errorf("visibleMounts[%q] = %v, want %v", n, got[n], w)
		}
	}
	// Without the directory's mount ID every parent counts.
	if got := visibleMounts(entries, "/run/netns", -1); got["pg-6"].root != "net:[4026532286]" {
		t.Errorf("visibleMounts without base: %v", got)
	}
	for name, st := range map[string]State{"pg-1": Bound, "pg-3": Bound} {
		if s, err := got[name].state(name); s != st || err != nil {
			t.Errorf("state(%s) = %v, %v", name, s, err)
		}
	}
	for _, name := range []string{"pg-4", "pg-8"} {
		if _, err := got[name].state(name); !errors.Is(err, ErrNotNamespace) {
			t.Errorf("state(%s) = %v, want ErrNotNamespace", name, err)
		}
	}
	if _, err := parseMountinfo([]byte("1 2 3\n")); err == nil {
		t.Errorf("malformed line accepted")
	}
}

func TestUnescapeOctal(t *testing.T) {
	for in, want := range map[string]string{
		`/a\040b`: "/a b", `/t\011`: "/t\t", `/n\012x`: "/n\nx", `/b\134s`: `/b\s`, `/x\04`: `/x\04`, `/plain`: "/plain", `\0`: `\0`,
	} {
		if got := unescapeOctal(in); got != want {
			t.Errorf("unescapeOctal(%q) = %q, want %q", in, got, want)
		}
	}
}

// A process whose namespace cannot be read is named in an IncompleteError;
// the others are in the map. One that vanished is skipped silently.
func TestScanProcessesIncomplete(t *testing.T) {
	root := t.TempDir()
	mk := func(pid, target string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(root, pid, "ns"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, filepath.Join(root, pid, "ns", "net")); err != nil {
			t.Fatal(err)
		}
	}
	okTarget := filepath.Join(root, "netfile")
	if err := os.WriteFile(okTarget, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	mk("10", okTarget)
	mk("11", "net")                          // a symlink to itself: ELOOP
	mk("12", filepath.Join(root, "missing")) // exited meanwhile: ENOENT
	procs, err := scanProcesses(root)
	var inc *IncompleteError
	if !errors.As(err, &inc) || len(inc.Failed) != 1 || inc.Failed[0].PID != 11 || inc.Scan != "processes" {
		t.Fatalf("scanProcesses = %v, want an IncompleteError naming pid 11", err)
	}
	n := 0
	for _, pids := range procs {
		n += len(pids)
	}
	if n != 1 {
		t.Errorf("procs = %v, want pid 10 only", procs)
	}
}
