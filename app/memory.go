package app

import (
	"errors"
	"log/slog"
	"math"
	"os"
	"runtime/debug"

	"github.com/phasegate/phasegate/internal/memlimit"
)

// memoryLimitShare is the part of the cgroup's memory limit the Go runtime
// is told to stay under: the rest is for what it does not count (the
// kernel's page cache of the process's files, a mapped state file).
const memoryLimitShare = 0.9

// applyMemoryLimit tells the Go runtime the memory limit of the process's
// cgroup, when it has one and nobody set the runtime's own (GOMEMLIMIT, or
// debug.SetMemoryLimit): the runtime then collects garbage harder as the
// process nears it, where it would otherwise let the heap double past
// what it holds and the kernel kill the process. Under a flood of
// connections that is the difference between a slower daemon and none.
// It logs what it did.
func applyMemoryLimit(log *slog.Logger, paths memlimit.Paths) {
	if _, set := os.LookupEnv("GOMEMLIMIT"); set || debug.SetMemoryLimit(-1) != math.MaxInt64 {
		return
	}
	lim, err := paths.Read()
	switch {
	case errors.Is(err, memlimit.ErrNoLimit):
		return
	case err != nil:
		log.Warn("the cgroup's memory limit could not be read: the Go runtime does not know it", "error", err)
		return
	}
	soft := int64(float64(lim.Bytes) * memoryLimitShare)
	debug.SetMemoryLimit(soft)
	log.Info("memory limit from the cgroup", "limit_bytes", lim.Bytes, "from", lim.From, "gomemlimit_bytes", soft)
}
