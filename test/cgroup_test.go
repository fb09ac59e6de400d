package test

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// memoryCgroup is a memory cgroup a test made, with a limit, as a
// container runtime makes one for a container whose spec says so: cgroup
// v1's memory controller or cgroup v2's, whichever this machine mounts.
type memoryCgroup struct {
	dir   string
	v2    bool
	limit int64
}

// newMemoryCgroup makes a cgroup limited to limit bytes of memory (and no
// swap), removed when the test ends: its processes must be gone by then,
// which the daemons' own clean-ups (registered later, run earlier) see to.
func newMemoryCgroup(t *testing.T, limit int64) *memoryCgroup {
	t.Helper()
	root, v2 := "/sys/fs/cgroup/memory", false
	if _, err := os.Stat(filepath.Join(root, "memory.limit_in_bytes")); err != nil {
		root, v2 = "/sys/fs/cgroup", true
		if b, err := os.ReadFile(filepath.Join(root, "cgroup.controllers")); err != nil || !strings.Contains(string(b), "memory") {
			t.Fatalf("no memory cgroup controller: neither v1 at /sys/fs/cgroup/memory nor v2 at /sys/fs/cgroup (%v)", err)
		}
		// The root may have processes and still give its children the
		// controller.
		if err := os.WriteFile(filepath.Join(root, "cgroup.subtree_control"), []byte("+memory"), 0); err != nil {
			t.Fatalf("enable the memory controller for the root's children: %v", err)
		}
	}
	cg := &memoryCgroup{dir: filepath.Join(root, fmt.Sprintf("phasegate-test-%d-%d", os.Getpid(), time.Now().UnixNano())), v2: v2, limit: limit}
	if err := os.Mkdir(cg.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// A killed process leaves the cgroup a moment after its wait.
		deadline := time.Now().Add(10 * time.Second)
		for os.Remove(cg.dir) != nil && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
	})
	files := map[string]string{"memory.limit_in_bytes": strconv.FormatInt(limit, 10)}
	if v2 {
		files = map[string]string{"memory.max": strconv.FormatInt(limit, 10), "memory.swap.max": "0"}
	}
	for name, v := range files {
		if err := os.WriteFile(filepath.Join(cg.dir, name), []byte(v), 0); err != nil && !(v2 && name == "memory.swap.max") {
			t.Fatalf("%s: %v", name, err)
		}
	}
	if !v2 {
		// Without swap accounting the limit is on memory alone.
		_ = os.WriteFile(filepath.Join(cg.dir, "memory.memsw.limit_in_bytes"), []byte(strconv.FormatInt(limit, 10)), 0)
	}
	return cg
}

// wrap returns argv run inside the cgroup from its first instruction: a
// shell moves itself in, then execs argv (the pid stays).
func (cg *memoryCgroup) wrap(argv ...string) []string {
	return append([]string{"/bin/sh", "-c", `echo $$ > "$0" && exec "$@"`, filepath.Join(cg.dir, "cgroup.procs")}, argv...)
}

// peak is the most memory the cgroup's processes used at once, in bytes,
// and how many of them the kernel killed for want of memory.
func (cg *memoryCgroup) peak(t *testing.T) (peak int64, oomKills int) {
	t.Helper()
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(cg.dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	peakFile, events, key := "memory.max_usage_in_bytes", "memory.oom_control", "oom_kill"
	if cg.v2 {
		peakFile, events = "memory.peak", "memory.events"
	}
	peak, _ = strconv.ParseInt(strings.TrimSpace(read(peakFile)), 10, 64)
	sc := bufio.NewScanner(strings.NewReader(read(events)))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 2 && f[0] == key {
			oomKills, _ = strconv.Atoi(f[1])
		}
	}
	return peak, oomKills
}
