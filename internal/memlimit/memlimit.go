package memlimit

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Limit is the memory limit of a cgroup, and where it was read.
type Limit struct {
	Bytes int64  // the smallest limit of the cgroup and those above it
	From  string // the file that said it
}

// Paths are where the cgroup interface is: the process's cgroups and the
// mounts. [Host] returns this machine's; a test gives its own.
type Paths struct {
	ProcCgroup string // /proc/self/cgroup
	V1Memory   string // cgroup v1's memory controller: /sys/fs/cgroup/memory
	V2         string // the cgroup v2 hierarchy: /sys/fs/cgroup
}

// Host returns the paths of this machine.
func Host() Paths {
	return Paths{ProcCgroup: "/proc/self/cgroup", V1Memory: "/sys/fs/cgroup/memory", V2: "/sys/fs/cgroup"}
}

// ErrNoLimit says the process's cgroup, and every one above it, has no
// memory limit, or that the machine has no memory controller.
var ErrNoLimit = errors.New("memlimit: no cgroup memory limit")

// Read returns the memory limit of the process's cgroup: cgroup v1's
// hierarchical_memory_limit (the least of its own and its ancestors'), or
// the least memory.max from its cgroup v2 directory up to the root.
func (p Paths) Read() (Limit, error) {
	b, err := os.ReadFile(p.ProcCgroup)
	if err != nil {
		return Limit{}, fmt.Errorf("memlimit: %w", err)
	}
	var v1, v2 string
	haveV1, haveV2 := false, false
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	for sc.Scan() {
		// hierarchy-ID:controller-list:cgroup-path
		f := strings.SplitN(sc.Text(), ":", 3)
		if len(f) != 3 {
			continue
		}
		switch {
		case f[0] == "0" && f[1] == "":
			v2, haveV2 = f[2], true
		case hasController(f[1], "memory"):
			v1, haveV1 = f[2], true
		}
	}
	if haveV1 {
		return p.readV1(v1)
	}
	if haveV2 {
		return p.readV2(v2)
	}
	return Limit{}, ErrNoLimit
}

func hasController(list, name string) bool {
	for c := range strings.SplitSeq(list, ",") {
		if c == name {
			return true
		}
	}
	return false
}

// readV1 reads hierarchical_memory_limit from memory.stat in the cgroup's
// directory, or, in a container that mounts its own cgroup as the root,
// at the mount.
func (p Paths) readV1(cg string) (Limit, error) {
	files, err := readEach([]string{filepath.Join(p.V1Memory, cg), p.V1Memory}, "memory.stat")
	if err != nil {
		return Limit{}, err
	}
	if len(files) == 0 {
		return Limit{}, ErrNoLimit
	}
	stat := files[0] // the cgroup's own when it has one
	for line := range strings.SplitSeq(stat.content, "\n") {
		v, ok := strings.CutPrefix(line, "hierarchical_memory_limit ")
		if !ok {
			continue
		}
		n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		if err != nil {
			return Limit{}, fmt.Errorf("memlimit: %s: hierarchical_memory_limit %q: %w", stat.path, v, err)
		}
		// No limit is the largest page-aligned int64.
		if n >= math.MaxInt64/2 {
			return Limit{}, ErrNoLimit
		}
		return Limit{Bytes: int64(n), From: stat.path}, nil
	}
	return Limit{}, fmt.Errorf("memlimit: %s has no hierarchical_memory_limit", stat.path)
}

// readV2 reads memory.max from the cgroup's directory and each above it,
// up to the hierarchy's root (which has none), keeping the least.
func (p Paths) readV2(cg string) (Limit, error) {
	var dirs []string
	for dir := filepath.Join(p.V2, cg); strings.HasPrefix(dir, p.V2) && dir != p.V2; dir = filepath.Dir(dir) {
		dirs = append(dirs, dir)
	}
	files, err := readEach(dirs, "memory.max")
	if err != nil {
		return Limit{}, err
	}
	var least Limit
	for _, f := range files {
		v := strings.TrimSpace(f.content)
		if v == "max" {
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return Limit{}, fmt.Errorf("memlimit: %s: %q: %w", f.path, v, err)
		}
		if least.From == "" || n < least.Bytes {
			least = Limit{Bytes: n, From: f.path}
		}
	}
	if least.From == "" {
		return Limit{}, ErrNoLimit
	}
	return least, nil
}

// cgroupFile is a file of a cgroup directory and what it holds.
type cgroupFile struct{ path, content string }

// readEach reads the file name in each of dirs, in their order, leaving
// out the directories without it.
func readEach(dirs []string, name string) ([]cgroupFile, error) {
	var out []cgroupFile
	for _, dir := range dirs {
		path := filepath.Join(dir, name)
		b, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("memlimit: %w", err)
		}
		out = append(out, cgroupFile{path, string(b)})
	}
	return out, nil
}
