package phases

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/phasegate/phasegate/control"
	"github.com/phasegate/phasegate/internal/names"
	"github.com/phasegate/phasegate/network/leases"
	"github.com/phasegate/phasegate/network/netns"
	"github.com/phasegate/phasegate/network/slot"
	"github.com/phasegate/phasegate/phases/cniapi"
	"github.com/phasegate/phasegate/phases/lease"
	"github.com/phasegate/phasegate/phases/slotsapi"
)

// The operator's routes on the control socket for the held slots (`phasegate
// held`): root's alone, whatever the policy grants. Each is audited under
// its method name, as the Slots API's calls are.
const (
	PathHeld        = "/held"
	PathHeldAdopt   = "/held/adopt"
	PathHeldRelease = "/held/release"
)

// heldRoute is one route of the held slots: its pattern, the method the
// guard audits it under, and its call.
type heldRoute struct {
	pattern, method string
	mutating        bool
	call            func(ctx context.Context, body []byte) (any, error)
}

// heldRoutes is the table of the held slots' routes, declared once: the
// socket declares them, the guard names them, register binds them.
func heldRoutes(d *Daemon) []heldRoute {
	list := func(context.Context, struct{}) (HeldList, error) { return d.listHeld() }
	return []heldRoute{
		{http.MethodGet + " " + PathHeld, "HeldList", false, func(ctx context.Context, _ []byte) (any, error) { return list(ctx, struct{}{}) }},
		{http.MethodPost + " " + PathHeldAdopt, "HeldAdopt", true, cniapi.JSONCall(d.adoptHeld)},
		{http.MethodPost + " " + PathHeldRelease, "HeldRelease", true, cniapi.JSONCall(d.releaseHeld)},
	}
}

// heldMethods returns the guard's method names of the held slots' routes,
// mutating and not.
func heldMethods() (mutating, reads []string) {
	for _, r := range heldRoutes(nil) {
		if r.mutating {
			mutating = append(mutating, r.method)
		} else {
			reads = append(reads, r.method)
		}
	}
	return mutating, reads
}

// bindHeld binds the held slots' routes on the control socket.
func (d *Daemon) bindHeld() error {
	for _, r := range heldRoutes(d) {
		if err := d.ctl.BindHTTP(r.pattern, heldHandler(d.ctlGuard, r)); err != nil {
			return err
		}
	}
	return nil
}

// HeldError is the answer of a held slots' route that failed: the gRPC
// code's name and the reason.
type HeldError struct {
	Code  string `json:"code"`
	Error string `json:"error"`
}

// heldHandler serves route r behind guard g, to root alone: JSON in and
// out, an error as a HeldError with the HTTP status of its code.
func heldHandler(g *control.Guard, r heldRoute) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		var answer any
		err := g.Call(req.Context(), r.method, func(ctx context.Context) error {
			var err error
			answer, err = r.serve(ctx, w, req)
			return slotsapi.Status(err) // its code for the guard's audit line
		})
		if err != nil {
			st := slotsapi.Convert(err)
			cniapi.WriteJSON(w, slotsapi.HTTPStatus(st.Code()), HeldError{Code: st.Code().String(), Error: st.Message()})
			return
		}
		cniapi.WriteJSON(w, http.StatusOK, answer)
	})
}

// serve answers req on route r, for root alone.
func (r heldRoute) serve(ctx context.Context, w http.ResponseWriter, req *http.Request) (any, error) {
	c, err := slotsapi.CallerOf(ctx)
	if err != nil {
		return nil, err
	}
	if !c.Principal.IsRoot() {
		return nil, lease.Errorf(lease.ErrDenied, "%s may not act on held slots: root's alone", c.Principal)
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, req.Body, 64<<10))
	if err != nil {
		return nil, lease.Errorf(lease.ErrInvalid, "read the request: %v", err)
	}
	return r.call(ctx, body)
}

// HeldList is GET /held's answer.
type HeldList struct {
	Held []HeldView `json:"held"`
}

// HeldView is one held slot as the operator sees it: why it is held,
// what lives in it now, and whether its host link is there.
type HeldView struct {
	lease.HeldSlot
	NetnsPath string `json:"netns_path"`
	// NetnsBound: the namespace held is still the one bound at NetnsPath.
	NetnsBound bool `json:"netns_bound"`
	HostLink   bool `json:"host_link"`
	// PIDs live in the namespace, or hold a descriptor on it, now.
	PIDs []int `json:"pids"`
}

// listHeld describes every held slot.
func (d *Daemon) listHeld() (HeldList, error) {
	out := HeldList{Held: []HeldView{}}
	held := d.held.List()
	if len(held) == 0 {
		return out, nil
	}
	live, err := lease.ScanLiveness()
	if err != nil {
		return out, lease.Errorf(lease.ErrInternal, "%v", err)
	}
	for _, h := range held {
		path := d.cfg.Slots.NetnsPath(h.Index)
		id, _ := netns.Stat(path)
		idx, _ := d.mgr.HostLinkIndex(h.Index)
		out.Held = append(out.Held, HeldView{HeldSlot: h, NetnsPath: path, NetnsBound: id == h.Netns, HostLink: idx != 0,
			PIDs: live.PIDs(h.Netns)})
	}
	return out, nil
}

// AdoptRequest is POST /held/adopt's request: the lease the held slot at
// Index becomes, for Owner (with RequestID and TTL, as an Acquire's).
type AdoptRequest struct {
	Index     int    `json:"index"`
	Owner     string `json:"owner"`
	RequestID string `json:"request_id,omitempty"`
	// TTL is a Go duration ("30m"); empty: held until released.
	TTL string `json:"ttl,omitempty"`
}

// AdoptAnswer is the lease a held slot became.
type AdoptAnswer struct {
	Index     int    `json:"index"`
	Owner     string `json:"owner"`
	RequestID string `json:"request_id,omitempty"`
	LeaseID   string `json:"lease_id"`
	Principal string `json:"principal"`
	TTL       string `json:"ttl,omitempty"`
	// Repaired says what of the slot's host side was put back.
	Repaired []string `json:"repaired,omitempty"`
}

// adoptHeld makes the held slot at req.Index a lease again, for its
// owner, as it is: nothing inside is touched; its host side is put back
// (the host link made again into the namespace if it was deleted, up,
// its address, its firewall element). The lease is recorded before the
// answer, as an Acquire's, with the root principal that adopted it; the
// owner's client renews and releases it with the lease id answered.
func (d *Daemon) adoptHeld(ctx context.Context, req AdoptRequest) (AdoptAnswer, error) {
	d.held.Ops.Lock()
	defer d.held.Ops.Unlock()
	h, err := d.heldAt(req.Index)
	if err != nil {
		return AdoptAnswer{}, err
	}
	if err := lease.CheckNames(req.Owner, req.RequestID); err != nil {
		return AdoptAnswer{}, err
	}
	var ttl time.Duration
	if req.TTL != "" {
		if ttl, err = time.ParseDuration(req.TTL); err != nil || ttl <= 0 {
			return AdoptAnswer{}, lease.Errorf(lease.ErrInvalid, "ttl %q: a positive duration, or none for a lease held until released", req.TTL)
		}
	}
	if !d.cfg.withinSlots(h.Index) {
		return AdoptAnswer{}, lease.Errorf(lease.ErrPrecondition, "slot %d is beyond --slots %d: release it, or run with more slots", h.Index, d.cfg.Slots.Slots)
	}
	c, err := slotsapi.CallerOf(ctx)
	if err != nil {
		return AdoptAnswer{}, err
	}
	control.Note(ctx, "slot", h.Index, "owner", req.Owner, "request_id", req.RequestID)
	sl, repaired, err := d.relink(ctx, h)
	if err != nil {
		return AdoptAnswer{}, err
	}
	now := time.Now()
	rec := leases.Record{
		Index: h.Index, State: leases.Leased,
		Owner: req.Owner, LeaseID: leases.NewLeaseID(), RequestID: req.RequestID, Principal: c.Principal.String(),
		Acquired: now, TTL: ttl, Netns: sl.NetnsID, HostIfindex: sl.HostIfIndex, Created: now,
	}
	if ttl > 0 {
		rec.Expires = now.Add(ttl)
	}
	if err := d.records.Put(ctx, rec); err != nil {
		var dup *leases.DuplicateRequestError
		if errors.As(err, &dup) {
			return AdoptAnswer{}, lease.Errorf(lease.ErrExists, "request %q of owner %q holds slot %d already", req.RequestID, req.Owner, dup.Index)
		}
		return AdoptAnswer{}, lease.Errorf(lease.ErrUnavailable, "record the lease: %v", err)
	}
	if err := d.pool.Adopt(sl); err != nil {
		return AdoptAnswer{}, lease.Errorf(lease.ErrInternal, "slot %d: %v (its lease is recorded: the next start restores it)", h.Index, err)
	}
	d.slots.Adopt(rec, sl)
	d.held.Remove(h.Index)
	d.log.Info("held slot adopted back as a lease", "slot", h.Index, "owner", names.Shown(req.Owner), "request_id", names.Shown(req.RequestID),
		"principal", c.Principal.String(), "netns_inode", sl.NetnsID.Ino, "repaired", fmt.Sprint(repaired))
	a := AdoptAnswer{Index: h.Index, Owner: req.Owner, RequestID: req.RequestID, LeaseID: rec.LeaseID, Principal: rec.Principal, Repaired: repaired}
	if ttl > 0 {
		a.TTL = ttl.String()
	}
	return a, nil
}

// heldAt returns the held slot at i, or why it cannot be acted on.
func (d *Daemon) heldAt(i int) (lease.HeldSlot, error) {
	h, ok := d.held.Get(i)
	switch {
	case !ok:
		return h, lease.Errorf(lease.ErrNotFound, "slot %d is not held", i)
	case h.LostLease:
		return h, lease.Errorf(lease.ErrPrecondition, "slot %d is still the index of a lost lease (owner %s): it is acted on once that lease ends", i, names.Shown(h.Owner))
	}
	return h, nil
}

// relink returns held slot h as a slot, its host side put back, or why
// it cannot be: its namespace must still be the one held.
func (d *Daemon) relink(ctx context.Context, h lease.HeldSlot) (*slot.Slot, []string, error) {
	s := d.cfg.Slots.Slot(h.Index)
	s.NetnsID = h.Netns
	if id, err := netns.Stat(s.NetnsPath); err != nil || id != h.Netns {
		return nil, nil, lease.Errorf(lease.ErrPrecondition, "slot %d: the namespace held is no longer bound at %s: release it", h.Index, s.NetnsPath)
	}
	idx, err := d.mgr.HostLinkIndex(h.Index)
	if err != nil {
		return nil, nil, lease.Errorf(lease.ErrInternal, "slot %d: %v", h.Index, err)
	}
	var repaired []string
	if idx == 0 {
		if err := d.mgr.RecreateHost(ctx, &s); err != nil {
			return nil, nil, lease.Errorf(lease.ErrPrecondition, "slot %d: its host link is gone and cannot be made again: %v", h.Index, err)
		}
		repaired = append(repaired, "host link made again into its namespace")
	} else {
		s.HostIfIndex = idx
		more, err := d.mgr.RepairHost(&s)
		if err != nil {
			return nil, nil, lease.Errorf(lease.ErrPrecondition, "slot %d: its host link cannot be repaired: %v", h.Index, err)
		}
		repaired = append(repaired, more...)
		if err := d.mgr.Firewall().Add(ctx, s.HostIf); err != nil {
			return nil, nil, lease.Errorf(lease.ErrUnavailable, "slot %d: its firewall element: %v", h.Index, err)
		}
	}
	return &s, repaired, nil
}

// ReleaseRequest is POST /held/release's request.
type ReleaseRequest struct {
	Index int `json:"index"`
}

// ReleaseAnswer says what the release of a held slot did to the
// processes that lived in it: cut off with their namespace, or killed
// with --reclaim-kill-orphans.
type ReleaseAnswer struct {
	Index   int            `json:"index"`
	Orphans []ReleasedProc `json:"processes,omitempty"`
}

// ReleasedProc is a process that lived in a released slot.
type ReleasedProc struct {
	PID    int    `json:"pid"`
	Comm   string `json:"comm"`
	Killed bool   `json:"killed"`
}

// releaseHeld tears the held slot at req.Index down, as a reclaim tears a
// leaked one down: the processes inside are cut off with their namespace,
// or killed when the daemon runs with --reclaim-kill-orphans. Its index
// is free once it is gone.
func (d *Daemon) releaseHeld(ctx context.Context, req ReleaseRequest) (ReleaseAnswer, error) {
	d.held.Ops.Lock()
	defer d.held.Ops.Unlock()
	h, err := d.heldAt(req.Index)
	if err != nil {
		return ReleaseAnswer{}, err
	}
	control.Note(ctx, "slot", h.Index)
	res := d.mgr.Teardown(ctx, slot.Assume(h.Index), d.cfg.teardownOptions())
	d.logTeardownProblems(res.Failed, res.Orphans, res.ProcScan, res.WaitErr)
	if err := res.Err(); err != nil {
		return ReleaseAnswer{}, lease.Errorf(lease.ErrUnavailable, "tear slot %d down: %v (it stays held)", h.Index, err)
	}
	if err := d.records.Remove(ctx, h.Index); err != nil {
		return ReleaseAnswer{}, lease.Errorf(lease.ErrUnavailable, "delete its held record: %v (torn down; the next start finds nothing there)", err)
	}
	d.held.Remove(h.Index)
	if d.cfg.withinSlots(h.Index) {
		if err := d.pool.Free(h.Index); err != nil {
			d.log.Warn("released held slot's index could not be freed", "slot", h.Index, "error", err)
		}
	}
	d.log.Info("held slot released: torn down", "slot", h.Index, "orphans", len(res.Orphans), "kill_orphans", d.cfg.ReclaimKillOrphans)
	a := ReleaseAnswer{Index: h.Index}
	for _, o := range res.Orphans {
		a.Orphans = append(a.Orphans, ReleasedProc{PID: o.PID, Comm: o.Comm, Killed: o.Killed})
	}
	return a, nil
}
