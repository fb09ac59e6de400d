package slot

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// A name that may be missing is looked up with the capabilities that make
// the kernel load modules out of the thread's effective set, and every
// thread has them back afterwards.
func TestIndexNoLoad(t *testing.T) {
	if unix.Geteuid() != 0 {
		t.Skip("needs root")
	}
	p, err := newLinkProbe()
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	before := threadCaps(t)
	for _, tc := range []struct {
		name string
		want int
	}{
		{"lo", 1},
		{"pgnoload0", 0}, // no such link: dev_load's path
	} {
		got, err := p.indexNoLoad(tc.name)
		if err != nil || got != tc.want {
			t.Errorf("indexNoLoad(%q) = %d, %v; want %d", tc.name, got, err, tc.want)
		}
	}
	for tid, caps := range threadCaps(t) {
		if was, ok := before[tid]; ok && caps != was {
			t.Errorf("thread %s: CapEff %#x after the lookups, %#x before", tid, caps, was)
		}
		if main := before[strconv.Itoa(os.Getpid())]; caps != main {
			t.Errorf("thread %s: CapEff %#x, the process's main thread %#x", tid, caps, main)
		}
	}
}

// dropLoadCaps takes exactly CAP_NET_ADMIN and CAP_SYS_MODULE out of the
// calling thread's effective set, and restore puts them back.
func TestDropLoadCaps(t *testing.T) {
	if unix.Geteuid() != 0 {
		t.Skip("needs root")
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	was := capEff(t, "/proc/thread-self/status")
	restore, err := dropLoadCaps()
	if err != nil {
		t.Fatal(err)
	}
	during := capEff(t, "/proc/thread-self/status")
	if err := restore(); err != nil {
		t.Fatalf("restore: %v (this thread keeps the smaller set)", err)
	}
	after := capEff(t, "/proc/thread-self/status")
	const dropped = 1<<unix.CAP_NET_ADMIN | 1<<unix.CAP_SYS_MODULE
	if during != was&^dropped {
		t.Errorf("CapEff while dropped %#x, want %#x (%#x without CAP_NET_ADMIN and CAP_SYS_MODULE)", during, was&^dropped, was)
	}
	if after != was {
		t.Errorf("CapEff after restore %#x, want %#x", after, was)
	}
}

// threadCaps is every thread's CapEff, by thread id.
func threadCaps(t *testing.T) map[string]uint64 {
	t.Helper()
	paths, err := filepath.Glob("/proc/self/task/*/status")
	if err != nil {
		t.Fatal(err)
	}
	caps := make(map[string]uint64, len(paths))
	for _, p := range paths {
		if c, err := readCapEff(p); err == nil { // else a thread that ended
			caps[filepath.Base(filepath.Dir(p))] = c
		}
	}
	return caps
}

// capEff reads the CapEff of a status file.
func capEff(t *testing.T, path string) uint64 {
	t.Helper()
	c, err := readCapEff(path)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func readCapEff(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			return strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		}
	}
	return 0, fmt.Errorf("%s: no CapEff", path)
}
