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
	for _, dir := range []string{filepath.Join(p.V1Memory, cg), p.V1Memory} {
		file := filepath.Join(dir, "memory.stat")
		b, err := os.ReadFile(file)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return Limit{}, fmt.Errorf("memlimit: %w", err)
		}
		for line := range strings.SplitSeq(string(b), "\n") {
			v, ok := strings.CutPrefix(line, "hierarchical_memory_limit ")
			if !ok {
				continue
			}
			n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return Limit{}, fmt.Errorf("memlimit: %s: hierarchical_memory_limit %q: %w", file, v, err)
			}
			// No limit is the largest page-aligned int64.
			if n >= math.MaxInt64/2 {
				return Limit{}, ErrNoLimit
			}
			return Limit{Bytes: int64(n), From: file}, nil
		}
		return Limit{}, fmt.Errorf("memlimit: %s has no hierarchical_memory_limit", file)
	}
	return Limit{}, ErrNoLimit
}

// readV2 reads memory.max from the cgroup's directory and each above it,
// up to the hierarchy's root (which has none), keeping the least.
func (p Paths) readV2(cg string) (Limit, error) {
	var least Limit
	for dir := filepath.Join(p.V2, cg); strings.HasPrefix(dir, p.V2) && dir != p.V2; dir = filepath.Dir(dir) {
		file := filepath.Join(dir, "memory.max")
		b, err := os.ReadFile(file)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return Limit{}, fmt.Errorf("memlimit: %w", err)
		}
		v := strings.TrimSpace(string(b))
		if v == "max" {
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return Limit{}, fmt.Errorf("memlimit: %s: %q: %w", file, v, err)
		}
		if least.From == "" || n < least.Bytes {
			least = Limit{Bytes: n, From: file}
		}
	}
	if least.From == "" {
		return Limit{}, ErrNoLimit
	}
	return least, nil
}
