package lease

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/phasegate/phasegate/internal/names"
	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/network/leases"
	"github.com/phasegate/phasegate/network/netns"
	"github.com/phasegate/phasegate/network/pool"
	"github.com/phasegate/phasegate/network/slot"
)

// RestoreCheck verifies the leases a start restored, from the first check
// to the last (DESIGN.md section 6): in the background, batch by batch,
// once the daemon serves (run), and at once for a call on one of those
// leases that cannot wait for its batch (settle). A check compares the
// slot with its record and repairs its host side; a lease found lost is
// reported the moment its state says LOST, and what was at its index is
// torn down. The leases are the service's table's: a check claims a lease
// under the table's lock, so that one caller at a time runs it.
type RestoreCheck struct {
	Table    *Table
	Pool     *pool.Pool     // takes a lost lease's slot back (Lose)
	Mgr      *slot.Manager  // identifies, repairs and tears down
	Found    slot.Inventory // what the start's scan found at the restored indices
	Teardown slot.TeardownOptions
	Log      *slog.Logger
	Health   Warnings
	Verified func(intact, lost int) // the daemon's metrics; nil counts nothing
	// Records takes a repaired lease's new host link; Held takes what is
	// at a lost lease's index when something lives in it.
	Records *Records
	Held    *HeldSlots
	// Task names the check's warning while it runs (the daemon's task).
	Task string
	// Lost are the indices of the leases the start found lost, sorted.
	Lost []int

	mu sync.Mutex // orders the leases-lost warnings, and guards Lost
}

// Warnings is where the check says what it is doing and what it found
// lost: the daemon's lifecycle, whose health shows them.
type Warnings interface {
	Warn(name, message string)
	ClearWarning(name string)
}

// leaseCheck is the verification a restored lease still waits for. One
// caller at a time runs it (the background task, or a Release, an Acquire
// retry or an expiry of that lease); the others wait for done. A check
// that fails is replaced by a fresh one, unclaimed, and done is closed, so
// that a waiter runs it again.
type leaseCheck struct {
	claimed bool          // being run (under Table.mu)
	done    chan struct{} // closed once the lease is settled or the run failed
}

func newLeaseCheck() *leaseCheck { return &leaseCheck{done: make(chan struct{})} }

// verdict is what verifying a restored lease's slot found: intact (its host
// side repaired; relinked when its host link was made again), lost (why),
// or nothing certain (err: the check is run again later).
type verdict struct {
	lost     string
	err      error
	relinked bool
}

// settle verifies restored lease l if it still waits for that, or waits
// for the check under way: on a nil return l is ACQUIRED or LOST.
func (c *RestoreCheck) settle(ctx context.Context, l *Lease) error {
	for {
		c.Table.mu.Lock()
		chk := l.check
		if chk == nil {
			c.Table.mu.Unlock()
			return nil
		}
		if !chk.claimed {
			chk.claimed = true
			c.Table.mu.Unlock()
			_, err := c.runChecks(ctx, []*Lease{l})
			return err
		}
		c.Table.mu.Unlock()
		select {
		case <-chk.done:
		case <-ctx.Done():
			return FromContext(ctx.Err())
		}
	}
}

// claimAndCheck verifies those of ls that still wait for it and that
// nobody else is verifying, and returns how many it settled and the first
// error of those it could not (they stay VERIFYING, for a later try).
func (c *RestoreCheck) claimAndCheck(ctx context.Context, ls []*Lease) (settled int, err error) {
	c.Table.mu.Lock()
	var mine []*Lease
	for _, l := range ls {
		// A lease ended meanwhile is settled by whoever ended it.
		if l.check != nil && !l.check.claimed && c.Table.leased[l.Rec.Index] == l {
			l.check.claimed = true
			mine = append(mine, l)
		}
	}
	c.Table.mu.Unlock()
	return c.runChecks(ctx, mine)
}

// runChecks verifies ls, which the caller claimed, and settles each by its
// verdict: ACQUIRED, LOST (its index stays the lease's, with no slot), or
// unclaimed again when nothing certain was found.
func (c *RestoreCheck) runChecks(ctx context.Context, ls []*Lease) (settled int, err error) {
	if len(ls) == 0 {
		return 0, nil
	}
	// A claimed lease's slot changes only here, by its claimer; its
	// owner, request id and attachment never change.
	slots := make([]*slot.Slot, len(ls))
	recs := make([]leases.Record, len(ls))
	for i, l := range ls {
		slots[i], recs[i] = l.Slot, c.Table.copyOf(l).Rec
	}
	vs := c.verify(ctx, slots, recs)
	var lost []leases.Record
	var reasons []string
	for i, l := range ls {
		v := vs[i]
		if v.lost != "" {
			if perr := c.Pool.Lose(l.Slot); perr != nil {
				c.Log.Warn("lost lease's slot was not the pool's", "slot", l.Slot.Index, "error", perr)
			}
		}
		c.Table.mu.Lock()
		chk := l.check
		switch {
		case v.err != nil:
			l.check = newLeaseCheck()
			err = cmp.Or(err, v.err)
		case v.lost != "":
			l.Slot, l.LostReason, l.check = nil, v.lost, nil
			lost, reasons = append(lost, l.Rec), append(reasons, v.lost)
			settled++
		default:
			l.check = nil
			settled++
		}
		c.Table.mu.Unlock()
		close(chk.done)
		if v.relinked {
			c.recordLink(ctx, l)
		}
	}
	if len(lost) > 0 {
		c.reportLost(lost, reasons)
	}
	if err != nil {
		return settled, Errorf(ErrUnavailable, "a restored lease's slot could not be verified yet (retry): %v", err)
	}
	return settled, nil
}

// outcome returns how many of ls still wait for their verification, and
// how many were found lost.
func (c *RestoreCheck) outcome(ls []*Lease) (unverified, lost int) {
	c.Table.mu.Lock()
	defer c.Table.mu.Unlock()
	for _, l := range ls {
		switch {
		case l.check != nil:
			unverified++
		case l.Slot == nil:
			lost++
		}
	}
	return unverified, lost
}

// Verifying the restored leases after SERVING (DESIGN.md section 6).
const (
	// VerifyWorkers bounds the slots checked at once: each check is a
	// stat, two ioctls and a netlink request the kernel serialises
	// (BenchmarkVerifyRestored: more workers than 2 are no faster, and 2
	// a little faster than 1; figures: docs/BENCHMARKS.md, "Figures behind
	// the network code"). Two leave a core to serving on a small machine.
	VerifyWorkers = 2
	// verifyBatch is how many leases the background verification claims
	// at a time: a Release of one of them waits for its batch, and each
	// batch adds its missing firewall elements in one transaction.
	verifyBatch = 64
	// verifyRetries bounds the passes over leases whose check found
	// nothing certain (a netlink error), verifyBackoff spaces them.
	verifyRetries = 3
	verifyBackoff = time.Second
)

// Run verifies every restored lease in the background, batch by
// batch, while /health says warn with the progress. A lease found lost is
// reported at once (reportLost). A drain stops it between batches: the
// records are untouched by a check, so the next start verifies what is
// left the same way.
func (c *RestoreCheck) Run(ctx context.Context, p *lifecycle.Progress, ls []*Lease) error {
	total := len(ls)
	start := time.Now()
	c.Health.Warn(c.Task, fmt.Sprintf("verifying %d restored leases in the background", total))
	defer c.Health.ClearWarning(c.Task)
	p.SetTotal(int64(total), "leases")
	var err error
	for pass := range verifyRetries {
		if pass > 0 {
			select {
			case <-time.After(verifyBackoff):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		err = nil
		for chunk := range slices.Chunk(ls, verifyBatch) {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			_, cerr := c.claimAndCheck(ctx, chunk)
			err = cmp.Or(err, cerr)
			left, _ := c.outcome(ls)
			p.SetDone(int64(total - left))
		}
		if err == nil {
			break
		}
		c.Log.Warn("restored leases: some could not be verified; trying again", "pass", pass+1, "error", err)
	}
	left, lost := c.outcome(ls)
	c.Log.Info("restored leases verified", "leases", total, "intact", total-left-lost, "lost", lost, "unverified", left,
		"duration", time.Since(start).Round(time.Millisecond).String())
	if left > 0 {
		return fmt.Errorf("%d restored leases could not be verified: %w", left, err)
	}
	return nil
}

// verify checks restored slots against their records and repairs their
// host side: the namespace and host link identity, the link up and its
// address, the host link made again into an intact namespace when it was
// deleted, the firewall element (one transaction for all). What was at a
// lost lease's index is torn down, so that the index is clean for whoever
// gets it after the lease, unless something lives in it: that is held,
// never destroyed. Every step is idempotent: a crash leaves the next
// start the same steps to take.
func (c *RestoreCheck) verify(ctx context.Context, slots []*slot.Slot, recs []leases.Record) []verdict {
	out, fixed := c.checkSlots(ctx, slots, recs, VerifyWorkers)
	var missing []string
	var missingAt []int
	lostObjects := slot.Inventory{}
	for i, sl := range slots {
		switch {
		case out[i].err != nil:
		case out[i].lost != "":
			if r, ok := c.Found[sl.Index]; ok {
				lostObjects[sl.Index] = r
			}
		case c.Found[sl.Index]&slot.HasElement == 0 && !out[i].relinked:
			missing, missingAt = append(missing, sl.HostIf), append(missingAt, i)
			fixed[i] = append(fixed[i], "firewall element")
		}
	}
	if len(missing) > 0 {
		if err := c.Mgr.Firewall().Add(ctx, missing...); err != nil {
			for _, i := range missingAt {
				out[i].err = fmt.Errorf("restore lease of slot %d: %w", slots[i].Index, err)
			}
		}
	}
	if err := c.holdLived(lostObjects, slots, recs, out); err != nil {
		for i, sl := range slots {
			if _, ok := lostObjects[sl.Index]; ok {
				out[i] = verdict{err: fmt.Errorf("look for processes in a lost lease's slot: %w", err)}
			}
		}
		lostObjects = nil
	}
	if len(lostObjects) > 0 {
		if err := c.Mgr.Teardown(ctx, lostObjects, c.Teardown).Err(); err != nil {
			for i, sl := range slots {
				if _, ok := lostObjects[sl.Index]; ok {
					out[i] = verdict{err: fmt.Errorf("clear the index of a lost lease: %w", err)}
				}
			}
		}
	}
	c.countVerdicts(slots, out, fixed)
	return out
}

// holdLived takes out of lostObjects, and holds, what is at a lost
// lease's index when something lives in it: the namespace bound at the
// slot's file, or the one the lease recorded (its file unmounted, the
// namespace kept alive by a process, its host link still there).
func (c *RestoreCheck) holdLived(lostObjects slot.Inventory, slots []*slot.Slot, recs []leases.Record, out []verdict) error {
	if len(lostObjects) == 0 {
		return nil
	}
	live, err := netns.ScanLiveness()
	if err != nil {
		return err
	}
	for i, sl := range slots {
		if _, ok := lostObjects[sl.Index]; !ok {
			continue
		}
		id, serr := netns.Stat(sl.NetnsPath)
		if serr != nil || !live.LivesIn(id) {
			id = recs[i].Netns
			if !live.LivesIn(id) {
				continue
			}
		}
		delete(lostObjects, sl.Index)
		c.Held.Put(HeldSlot{Index: sl.Index, Netns: id, Since: time.Now(), LostLease: true,
			Owner: recs[i].Owner, RequestID: recs[i].RequestID,
			Reason: "its lease's slot was not the one recorded (" + out[i].lost + ") and something lives in it"})
		c.Log.Warn("lost lease's index kept: something lives in what is there; held, not torn down", "slot", sl.Index,
			"netns_inode", id.Ino, "pids", fmt.Sprint(live.PIDs(id)))
	}
	return nil
}

// checkSlots runs verifyOne on every slot, workers at a time.
func (c *RestoreCheck) checkSlots(ctx context.Context, slots []*slot.Slot, recs []leases.Record, workers int) ([]verdict, [][]string) {
	out := make([]verdict, len(slots))
	fixed := make([][]string, len(slots))
	var g errgroup.Group
	g.SetLimit(workers)
	for i, sl := range slots {
		g.Go(func() error {
			out[i], fixed[i] = c.verifyOne(ctx, sl, recs[i].Attachment == nil)
			return nil
		})
	}
	_ = g.Wait() // every check's outcome is in out
	return out, fixed
}

// verifyOne checks one restored slot and repairs its host side: what it
// repaired, or why the lease is lost, or what kept it from telling. A
// slot whose host link was deleted while its namespace stayed, the one
// recorded, gets its veth pair made again (not an attached one, whose
// inside end was in the runtime's namespace): the workload inside keeps
// running, reachable again.
func (c *RestoreCheck) verifyOne(ctx context.Context, sl *slot.Slot, relinkable bool) (verdict, []string) {
	found, err := c.Mgr.Identify(sl.Index, sl.NetnsID, sl.HostIfIndex)
	if err == nil {
		var fixed []string
		if fixed, err = c.Mgr.RepairHost(found); err == nil {
			return verdict{}, fixed
		}
	}
	if errors.Is(err, slot.ErrGone) && relinkable {
		if rerr := c.Mgr.RecreateHost(ctx, sl); rerr == nil {
			return verdict{relinked: true}, []string{"host link made again into its namespace"}
		} else if !errors.Is(rerr, slot.ErrGone) {
			c.Log.Warn("restored lease: its host link could not be made again", "slot", sl.Index, "error", rerr)
		}
	}
	if errors.Is(err, slot.ErrGone) {
		return verdict{lost: err.Error()}, nil
	}
	return verdict{err: fmt.Errorf("restore lease of slot %d: %w", sl.Index, err)}, nil
}

// recordLink records the new host link of l's slot, made again by the
// check, so that the next start finds it the one recorded.
func (c *RestoreCheck) recordLink(ctx context.Context, l *Lease) {
	cp := c.Table.copyOf(l)
	if cp.Slot == nil {
		return
	}
	ifindex := cp.Slot.HostIfIndex
	rec, err := c.Records.update(ctx, cp.Rec.Index, func(r *leases.Record) error {
		if r.State != leases.Leased || r.LeaseID != cp.Rec.LeaseID {
			return fmt.Errorf("slot %d: the lease changed meanwhile", r.Index)
		}
		r.HostIfindex = ifindex
		return nil
	})
	if err != nil {
		c.Log.Warn("restored lease: the host link made again could not be recorded; the next start makes it again", "slot", cp.Rec.Index, "error", err)
		return
	}
	c.Table.setRecordOf(rec)
}

// countVerdicts logs each restored lease whose host side needed repair and
// counts the outcomes.
func (c *RestoreCheck) countVerdicts(slots []*slot.Slot, out []verdict, fixed [][]string) {
	intact, lost := 0, 0
	for i, sl := range slots {
		switch {
		case out[i].err != nil:
		case out[i].lost != "":
			lost++
		default:
			intact++
			if len(fixed[i]) > 0 {
				c.Log.Info("restored lease: host side repaired, nothing inside touched", "slot", sl.Index, "repaired", strings.Join(fixed[i], ", "))
			}
		}
	}
	if c.Verified != nil {
		c.Verified(intact, lost)
	}
}

// reportLost says that leases were found lost , the moment
// their state says LOST: a log line each and the health warning, which
// names every lease lost since the start.
func (c *RestoreCheck) reportLost(lost []leases.Record, reasons []string) {
	for i, rec := range lost {
		c.Log.Warn("lease lost across the restart", "slot", rec.Index, "owner", names.Shown(rec.Owner), "reason", reasons[i])
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rec := range lost {
		c.Lost = append(c.Lost, rec.Index)
	}
	slices.Sort(c.Lost)
	// Under c.mu: two batches' Warnings must not overtake each other.
	c.Health.Warn(WarnLeasesLost, LostMessage(c.Lost))
}

// LostMessage is the leases-lost warning.
func LostMessage(slots []int) string {
	return fmt.Sprintf("%d leases lost across the restart (slots %v): their namespace or host link was gone or made again; owners see why in Get", len(slots), slots)
}
