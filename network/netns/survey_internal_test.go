package netns

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
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
		"pg-1": {"nsfs", "net:[4026532281]", ID{Dev: unix.Mkdev(0, 4), Ino: 4026532281}},
		"pg-2": {"nsfs", "net:[4026532283]", ID{Dev: unix.Mkdev(0, 4), Ino: 4026532283}}, // the top of the stack
		"pg-3": {"nsfs", "net:[4026532284]", ID{Dev: unix.Mkdev(0, 4), Ino: 4026532284}}, // a namespace over a foreign mount
		"pg-4": {"nsfs", "uts:[4026531838]", ID{}},                                       // not a network namespace: no identity
		"pg 5": {"nsfs", "net:[4026532285]", ID{Dev: unix.Mkdev(0, 4), Ino: 4026532285}},
		"pg-8": {"ext4", "/", ID{}},
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

// BenchmarkParseMountinfo parses the mountinfo of a host with 10,000 bound
// namespaces, beside the way it was parsed before (a copy and
// strings.Fields per line), which must agree with it.
func BenchmarkParseMountinfo(b *testing.B) {
	var in []byte
	in = append(in, "22 1 0:21 / /run rw,nosuid shared:5 - tmpfs tmpfs rw\n30 22 0:21 /netns /run/netns rw shared:9 - tmpfs tmpfs rw\n"...)
	for i := range 10000 {
		in = fmt.Appendf(in, "%d 30 0:4 net:[%d] /run/netns/pg-%d rw shared:9 - nsfs nsfs rw\n", 100+i, 4026532281+i, i+1)
	}
	got, err := parseMountinfo(in)
	want, werr := parseMountinfoFields(in)
	if err != nil || werr != nil || !slices.Equal(got, want) {
		b.Fatalf("the two parses differ: %v, %v", err, werr)
	}
	b.Run("fields", func(b *testing.B) {
		for b.Loop() {
			if _, err := parseMountinfoFields(in); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("substrings", func(b *testing.B) {
		for b.Loop() {
			if _, err := parseMountinfo(in); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// parseMountinfoFields is parseMountinfo as it was: the benchmark's
// baseline.
func parseMountinfoFields(b []byte) ([]mountEntry, error) {
	out := make([]mountEntry, 0, bytes.Count(b, []byte{'\n'}))
	for len(b) > 0 {
		line := b
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line, b = b[:i], b[i+1:]
		} else {
			b = nil
		}
		if len(line) == 0 {
			continue
		}
		f := strings.Fields(string(line))
		sep := -1
		for i := 6; i < len(f); i++ {
			if f[i] == "-" {
				sep = i
				break
			}
		}
		if len(f) < 7 || sep < 0 || sep+1 >= len(f) {
			return nil, fmt.Errorf("netns: mountinfo: malformed line %q", line)
		}
		id, err1 := strconv.Atoi(f[0])
		parent, err2 := strconv.Atoi(f[1])
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("netns: mountinfo: malformed line %q", line)
		}
		out = append(out, mountEntry{
			id: id, parent: parent, dev: f[2],
			root: unescapeOctal(f[3]), point: unescapeOctal(f[4]), fstype: f[sep+1],
		})
	}
	return out, nil
}
