package memlimit

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// The limit as each layout of cgroup files gives it: v1 by the hierarchy's
// own figure, in the cgroup's directory or at a container's mount; v2 as
// the least memory.max on the way up; none, or no controller.
func TestRead(t *testing.T) {
	const unlimitedV1 = "9223372036854771712"
	for _, tc := range []struct {
		name   string
		cgroup string            // /proc/self/cgroup
		files  map[string]string // under the fake /sys/fs/cgroup
		want   int64
		from   string
		err    error
	}{
		{"v1", "4:memory:/kubepods/pod1/c1\n1:cpu:/x\n",
			map[string]string{"memory/kubepods/pod1/c1/memory.stat": "cache 1\nhierarchical_memory_limit 134217728\n"}, 134217728, "memory/kubepods/pod1/c1/memory.stat", nil},
		{"v1 in a container that mounts its own cgroup", "4:memory:/kubepods/pod1/c1\n",
			map[string]string{"memory/memory.stat": "hierarchical_memory_limit 67108864\n"}, 67108864, "memory/memory.stat", nil},
		{"v1 with controllers joined", "5:cpu,memory:/nomad/a\n",
			map[string]string{"memory/nomad/a/memory.stat": "hierarchical_memory_limit 268435456\n"}, 268435456, "memory/nomad/a/memory.stat", nil},
		{"v1 unlimited", "4:memory:/\n",
			map[string]string{"memory/memory.stat": "hierarchical_memory_limit " + unlimitedV1 + "\n"}, 0, "", ErrNoLimit},
		{"v2: the least on the way up", "0::/system.slice/phasegate.service\n",
			map[string]string{"system.slice/phasegate.service/memory.max": "max\n", "system.slice/memory.max": "536870912\n"},
			536870912, "system.slice/memory.max", nil},
		{"v2: its own below its parent's", "0::/a/b\n",
			map[string]string{"a/b/memory.max": "134217728\n", "a/memory.max": "536870912\n"}, 134217728, "a/b/memory.max", nil},
		{"v2 unlimited", "0::/a\n", map[string]string{"a/memory.max": "max\n"}, 0, "", ErrNoLimit},
		{"no memory controller", "1:cpu:/x\n", nil, 0, "", ErrNoLimit},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			p := Paths{ProcCgroup: filepath.Join(dir, "cgroup"), V1Memory: filepath.Join(dir, "sys", "memory"), V2: filepath.Join(dir, "sys")}
			write(t, p.ProcCgroup, tc.cgroup)
			for name, data := range tc.files {
				write(t, filepath.Join(dir, "sys", name), data)
			}
			got, err := p.Read()
			if !errors.Is(err, tc.err) || (tc.err == nil && err != nil) {
				t.Fatalf("Read: %v, want %v", err, tc.err)
			}
			if want := filepath.Join(dir, "sys", tc.from); got.Bytes != tc.want || (tc.from != "" && got.From != want) {
				t.Errorf("Read = %+v, want %d from %s", got, tc.want, want)
			}
		})
	}
}

func write(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}
