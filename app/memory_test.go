package app

import (
	"bytes"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/phasegate/phasegate/internal/memlimit"
)

// A cgroup's memory limit becomes 90% of it as the runtime's soft limit,
// said in the log; GOMEMLIMIT, or a limit the program set, is left as it
// is, and so is a process with no limit.
func TestApplyMemoryLimit(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(math.MaxInt64))
	dir := t.TempDir()
	paths := memlimit.Paths{ProcCgroup: filepath.Join(dir, "cgroup"), V1Memory: filepath.Join(dir, "memory"), V2: dir}
	if err := os.WriteFile(paths.ProcCgroup, []byte("0::/svc\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "svc"), 0o755); err != nil {
		t.Fatal(err)
	}
	setMax := func(v string) {
		if err := os.WriteFile(filepath.Join(dir, "svc", "memory.max"), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	apply := func() (int64, string) {
		var log bytes.Buffer
		applyMemoryLimit(slog.New(slog.NewTextHandler(&log, nil)), paths)
		return debug.SetMemoryLimit(-1), log.String()
	}

	setMax("max\n")
	if got, log := apply(); got != math.MaxInt64 || log != "" {
		t.Errorf("no limit: the runtime's is %d, log %q", got, log)
	}
	setMax("134217728\n")
	if got, log := apply(); got != 120795955 || !strings.Contains(log, "memory limit from the cgroup") || !strings.Contains(log, "limit_bytes=134217728") {
		t.Errorf("a limit of 128 MiB: the runtime's is %d, log %q", got, log)
	}
	debug.SetMemoryLimit(50 << 20) // the program's own
	if got, _ := apply(); got != 50<<20 {
		t.Errorf("a limit the program set became %d", got)
	}
	debug.SetMemoryLimit(math.MaxInt64)
	t.Setenv("GOMEMLIMIT", "off")
	if got, _ := apply(); got != math.MaxInt64 {
		t.Errorf("with GOMEMLIMIT=off the runtime's limit became %d", got)
	}
}
