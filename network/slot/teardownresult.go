package slot

import (
	"errors"
	"fmt"
	"time"
)

// TeardownResult says what happened to each slot given to Teardown.
type TeardownResult struct {
	// Reclaimed slots are gone: no netns file, no host link, no element.
	Reclaimed []int
	// Failed slots still have something left; their index must stay
	// quarantined.
	Failed []Failure
	// Deferred slots were not started because of the budget or ctx.
	Deferred []int
	// Orphans are the processes found inside torn-down namespaces.
	Orphans []Orphan
	// Holders are the processes that held a descriptor on a torn-down
	// namespace; their slots are cut off without waiting.
	Holders []Holder
	// CutOff slots had their host link deleted explicitly because their
	// namespace outlived its file (a process or descriptor holds it), or
	// because the link pairs with an attachment's end, which lives in a
	// namespace not the slot's (Manager.Unplug).
	CutOff []int
	// ProcScan is why the /proc scans for processes inside the namespaces
	// or holding descriptors on them failed or were incomplete (a
	// *netns.IncompleteError names the processes that could not be read);
	// nil when they read everything. Namespaces such processes may hold are
	// treated as possibly held: their host links, if they outlive the wait,
	// are cut off, and nothing is killed on the strength of a failed scan.
	ProcScan error
	// WaitErr is the error that ended a wait for host links early, if
	// any; the links still there were then cut off one by one.
	WaitErr error
	// Batches is how many batches the slots were handed to the kernel in.
	Batches int
	// Timings is where the time went.
	Timings Timings
}

// Failure is a slot whose teardown failed.
type Failure struct {
	Index int
	Err   error
}

// Orphan is a process found inside a slot's namespace before it was torn
// down.
type Orphan struct {
	Index int
	PID   int
	Comm  string
	// Killed: SIGKILL was sent (KillOrphans).
	Killed bool
	// Gone: with KillOrphans, the process had exited or left the
	// namespace by the time it was to be signalled, and was not.
	Gone bool
	// Err is why it could not be signalled (KillOrphans); the slot was cut
	// off instead.
	Err error
}

// Holder is a process that held a descriptor on a slot's namespace (without
// living in it) when the slot was torn down. Holders are never killed.
type Holder struct {
	Index int
	PID   int
	Comm  string
}

// Timings splits a teardown's wall time into its phases (summed over
// batches).
type Timings struct {
	// Procs is the /proc scan for processes inside the namespaces or
	// holding descriptors on them.
	Procs time.Duration
	// Unlink is the detach+unlink phase (workers).
	Unlink time.Duration
	// Wait is the wait for the kernel to remove the host links, and the
	// deletion of those that stayed.
	Wait time.Duration
	// Firewall is the nftables transaction.
	Firewall time.Duration
	// Pause is the time spent in BatchPause.
	Pause time.Duration
}

// FailedIndices returns the indices of Failed.
func (r *TeardownResult) FailedIndices() []int {
	out := make([]int, 0, len(r.Failed))
	for _, f := range r.Failed {
		out = append(out, f.Index)
	}
	return out
}

// String summarizes a result.
func (r *TeardownResult) String() string {
	return fmt.Sprintf("reclaimed %d, failed %d, deferred %d, orphans %d, cut off %d",
		len(r.Reclaimed), len(r.Failed), len(r.Deferred), len(r.Orphans), len(r.CutOff))
}

// Err joins the failures into one error (nil when there are none). The
// result-wide errors (ProcScan, WaitErr) are not in it: they say what
// Teardown could not see, not what it left behind.
func (r *TeardownResult) Err() error {
	errs := make([]error, 0, len(r.Failed))
	for _, f := range r.Failed {
		errs = append(errs, fmt.Errorf("slot %d: %w", f.Index, f.Err))
	}
	return errors.Join(errs...)
}
