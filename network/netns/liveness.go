package netns

import (
	"errors"
	"fmt"
	"slices"
)

// Liveness is one scan of /proc: the namespaces processes live in or hold
// a descriptor on.
type Liveness struct {
	procs, holders Processes
}

// ScanLiveness scans /proc once ([ScanProcesses], [ScanHolders]). A scan
// that could not read some processes (pid 1 in some sandboxes) still
// tells where the others live; what it could not read is for the caller's
// teardown to report, as a reclaim's own scan does.
func ScanLiveness() (*Liveness, error) {
	var incomplete *IncompleteError
	procs, err := ScanProcesses()
	if err != nil && !errors.As(err, &incomplete) {
		return nil, fmt.Errorf("netns: scan processes: %w", err)
	}
	holders, err := ScanHolders()
	if err != nil && !errors.As(err, &incomplete) {
		return nil, fmt.Errorf("netns: scan descriptor holders: %w", err)
	}
	return &Liveness{procs: procs, holders: holders}, nil
}

// LivesIn reports whether something lives in namespace id: a process with
// a thread there, or one holding a descriptor on it.
func (l *Liveness) LivesIn(id ID) bool {
	return id != (ID{}) && (len(l.procs[id]) > 0 || len(l.holders[id]) > 0)
}

// PIDs returns the processes in or holding id, for the operator's list.
func (l *Liveness) PIDs(id ID) []int {
	return slices.Compact(slices.Sorted(slices.Values(slices.Concat(l.procs[id], l.holders[id]))))
}
