package phases

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strings"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	cniv1 "github.com/phasegate/phasegate/api/cni/v1"
	"github.com/phasegate/phasegate/control"
	"github.com/phasegate/phasegate/internal/names"
	"github.com/phasegate/phasegate/network/egress"
	"github.com/phasegate/phasegate/network/leases"
	"github.com/phasegate/phasegate/network/netns"
	"github.com/phasegate/phasegate/network/slot"
)

// cniService serves the CNI plugin's calls (cmd/phasegate-cni, DESIGN.md
// §11) over the Slots service's leases: an attachment is a lease of owner
// "cni/<network>" and request "<container id>/<ifname>" whose slot's
// inside end lives in the runtime's namespace. Every call comes through
// the control socket's guard, under the method names of cniMethods.
type cniService struct {
	slots *slotsService
	// degraded says why the daemon serves with its datapath not whole
	// (STATUS answers 51), or "".
	degraded func() string
	// keys orders an ADD and a DEL of one key (cnijoin.go).
	keys keyLocks
}

// gcWorkers bounds the attachments GC ends at once: their records are
// written in shared commits and their slots torn down in the pool's
// batches, whatever the number.
const gcWorkers = 64

// checkKey refuses a key the CNI spec would not give: the network's name
// and the container id by the spec's rule, the ifname by the kernel's,
// and together within a request id's length. DEL and CHECK check this
// much, so that a key attached before the names rule stays theirs.
func checkKey(k cniv1.Key) error {
	if err := checkNetwork(k.Network); err != nil {
		return err
	}
	if err := names.CheckCNIName("CNI_CONTAINERID", k.ContainerID); err != nil {
		return cniErr(codes.InvalidArgument, cniv1.CodeInvalidEnvironment, err.Error())
	}
	if len(k.RequestID()) > names.MaxLen {
		return cniErr(codes.InvalidArgument, cniv1.CodeInvalidEnvironment, fmt.Sprintf("network name and container id together are limited to %d bytes", names.MaxLen))
	}
	if err := slot.CheckIfName(k.IfName); err != nil {
		return cniErr(codes.InvalidArgument, cniv1.CodeInvalidEnvironment, "CNI_IFNAME: "+err.Error())
	}
	return nil
}

// checkNewKey refuses a key for a new attachment as every door does
// (cniv1.Key.Check: the plugin before it calls, and the ADD route; the
// Slots API makes no attachment): the names rule for all three parts, and the kernel's for the
// interface name, which the lease's request id holds and the kernel must
// make as it is.
func checkNewKey(k cniv1.Key) error {
	var ke *cniv1.KeyError
	if err := k.Check(); errors.As(err, &ke) {
		return cniErr(codes.InvalidArgument, ke.Code, err.Error())
	}
	return nil
}

// checkNetwork refuses a network name the CNI spec would not give.
func checkNetwork(name string) error {
	if err := names.CheckCNIName("network name", name); err != nil {
		return cniErr(codes.InvalidArgument, cniv1.CodeInvalidConfig, err.Error())
	}
	if len(cniv1.OwnerPrefix+name) > names.MaxLen {
		return cniErr(codes.InvalidArgument, cniv1.CodeInvalidConfig, fmt.Sprintf("network name is %d bytes: at most %d", len(name), names.MaxLen-len(cniv1.OwnerPrefix)))
	}
	return nil
}

// mayAttach returns the caller if it may attach slots for key's network.
func mayAttach(ctx context.Context, k cniv1.Key) (control.Caller, error) {
	control.Note(ctx, "request_id", names.Shown(k.RequestID()))
	return mayAttachFor(ctx, k.Owner())
}

// mayAttachFor returns the caller if it may attach slots for owner.
func mayAttachFor(ctx context.Context, owner string) (control.Caller, error) {
	c, err := callerOf(ctx)
	if err != nil {
		return c, err
	}
	control.Note(ctx, "owner", names.Shown(owner))
	if !c.Grant.MayAttach(owner) {
		return c, cniErr(codes.PermissionDenied, cniv1.CodeRefused,
			fmt.Sprintf("%s may not attach slots for \"%s\" (the control policy grants it no attach for that owner)", c.Principal, names.Shown(owner)))
	}
	return c, nil
}

// add attaches a slot to the namespace at req.Netns, or answers the
// attachment a first ADD of the key made.
func (c *cniService) add(ctx context.Context, req cniv1.AddRequest) (*cniv1.Attachment, error) {
	if err := checkNewKey(req.Key); err != nil {
		return nil, err
	}
	caller, err := mayAttach(ctx, req.Key)
	if err != nil {
		return nil, err
	}
	pol, cost, err := c.egressOf(req)
	if err != nil {
		return nil, asCNI(err, cniv1.CodeInvalidConfig)
	}
	// A large policy costs its principal as much of its rate as through
	// the Slots API.
	if err := control.Charge(ctx, cost); err != nil {
		return nil, asCNI(err, cniv1.CodeTryAgainLater)
	}
	control.Note(ctx, "netns", req.Netns)
	to, err := target(ctx, caller.Principal, req.Netns, req.IfName)
	if err != nil {
		return nil, err
	}
	defer to.close()
	if err := c.mayJoin(to); err != nil {
		return nil, err
	}
	owner, requestID := req.Owner(), req.RequestID()
	unlock, err := c.keys.lock(ctx, owner+"\x00"+requestID)
	if err != nil {
		return nil, asCNI(status.FromContextError(err).Err(), cniv1.CodeTryAgainLater)
	}
	defer unlock()
	if l, ok := c.slots.table.byRequest(owner, requestID); ok {
		if err := keyTaken(caller, req.Key, c.slots.table.copyOf(l)); err != nil {
			return nil, err
		}
	}
	a, err := c.slots.acquire(ctx, caller, owner, requestID, 0, pol, to)
	if err != nil {
		return nil, asCNI(err, cniv1.CodeIOFailure)
	}
	l := c.slots.table.copyOf(a.l)
	control.Note(ctx, "slot", l.rec.Index, "retry", a.retry)
	if l.slot == nil {
		return nil, cniErr(codes.FailedPrecondition, cniv1.CodeCheckFailed,
			fmt.Sprintf("attachment %s/%s of %q was lost across a restart (%s): DEL it, then ADD again", req.ContainerID, req.IfName, req.Network, l.lostReason))
	}
	made := a.made
	if made == nil {
		// A repeated ADD answers what the first one made, as it is now.
		if made, err = c.slots.mgr.Attached(l.slot, to.fd, req.IfName); err != nil {
			return nil, cniErr(codes.FailedPrecondition, cniv1.CodeCheckFailed, err.Error())
		}
	}
	return attachmentOf(l.slot, made, req.Netns), nil
}

// attachmentOf is ADD's answer for slot s attached as a in the namespace at
// path.
func attachmentOf(s *slot.Slot, a *slot.Attachment, path string) *cniv1.Attachment {
	return &cniv1.Attachment{
		Slot: s.Index, HostIf: s.HostIf, HostMAC: a.HostMAC.String(),
		IfName: a.IfName, MAC: a.MAC.String(), Netns: path,
		Address: s.InsideAddr.String(), Gateway: s.HostAddr.Addr().String(),
	}
}

// egressOf is ADD's egress policy (nil: none), and what it costs of the
// caller's rate: the network's policy, narrowed by the container's own
// when the runtime passed one (egress.Narrow: the attachment lets out
// only what both let out). It costs as many calls as the larger of what
// it was given and what it is.
func (c *cniService) egressOf(req cniv1.AddRequest) (*egress.Policy, int, error) {
	network, err := parseEgress(req.Egress, c.slots.egress)
	if err != nil {
		return nil, 0, err
	}
	container, err := parseEgress(req.ContainerEgress, c.slots.egress)
	if err != nil {
		return nil, 0, status.Error(codes.InvalidArgument, "the container's "+status.Convert(err).Message())
	}
	pol, err := egress.Narrow(network, container, c.slots.egress)
	if err != nil {
		return nil, 0, status.Error(codes.InvalidArgument, err.Error())
	}
	return pol, max(egressCost(pol), egressCost(network)+egressCost(container)), nil
}

// del ends the attachment of req's key: an unknown key, one ended
// meanwhile and one whose container's namespace is gone are all success.
// Another principal's attachment is refused, naming it (cnikeys.go); a
// lease of the Slots API that squats the key is ended.
func (c *cniService) del(ctx context.Context, req cniv1.DelRequest) error {
	caller, err := mayAttach(ctx, req.Key)
	if err != nil {
		return err
	}
	if checkKey(req.Key) != nil {
		return nil // no such key was ever attached
	}
	// An ADD of the key under way finishes first: this DEL ends what it
	// made.
	unlock, err := c.keys.lock(ctx, req.Owner()+"\x00"+req.RequestID())
	if err != nil {
		return asCNI(status.FromContextError(err).Err(), cniv1.CodeTryAgainLater)
	}
	defer unlock()
	l, ok := c.slots.table.byRequest(req.Owner(), req.RequestID())
	if !ok {
		return nil
	}
	rec := c.slots.table.copyOf(l).rec
	control.Note(ctx, "slot", rec.Index)
	if why := whyKept(caller, rec); why != "" {
		return cniErr(codes.PermissionDenied, cniv1.CodeRefused, fmt.Sprintf("attachment %s of network %q: %s", names.Shown(req.RequestID()), req.Network, why))
	}
	if rec.Attachment == nil {
		control.Note(ctx, "squatted_by", names.Shown(rec.Principal))
		c.slots.log.Warn("a lease of the Slots API held a CNI key: DEL ends it", "slot", rec.Index, "owner", names.Shown(rec.Owner),
			"request_id", names.Shown(rec.RequestID), "principal", names.Shown(rec.Principal))
	}
	return c.end(ctx, rec, c.slots.pool.Discard)
}

// end ends the attachment recorded as rec, unless its lease ended (and
// perhaps a new one began at its index) meanwhile, and gives its slot to
// the pool through put.
func (c *cniService) end(ctx context.Context, rec leases.Record, put func(context.Context, *slot.Slot) error) error {
	l, err := c.slots.endLease(ctx, rec.Index, rec.LeaseID)
	switch {
	case errors.Is(err, leases.ErrNotFound) || errors.Is(err, errWrongLease):
		return nil
	case err != nil:
		return asCNI(leaseError(rec.Index, err), cniv1.CodeIOFailure)
	}
	// The attachment is cut off before put (its host end deleted, the
	// container's end with it). With pool.Discard, DEL answers then: the
	// teardown of the slot's own namespace and the replacement are the
	// pool's, not the runtime's to wait for, and the index comes back only
	// once the teardown is done (or stays quarantined for the reconciler).
	c.slots.giveBackBy(context.WithoutCancel(ctx), l, put)
	c.slots.count("released")
	c.slots.log.Info("attachment ended", "slot", rec.Index, "owner", names.Shown(rec.Owner), "request_id", names.Shown(rec.RequestID))
	return nil
}

// check fails naming what differs from what ADD made.
func (c *cniService) check(ctx context.Context, req cniv1.CheckRequest) error {
	if err := checkKey(req.Key); err != nil {
		return err
	}
	caller, err := mayAttach(ctx, req.Key)
	if err != nil {
		return err
	}
	l, ok := c.slots.table.byRequest(req.Owner(), req.RequestID())
	if !ok {
		return cniErr(codes.NotFound, cniv1.CodeCheckFailed, fmt.Sprintf("no attachment %s on network %q", names.Shown(req.RequestID()), req.Network))
	}
	if err := c.slots.settle(ctx, l); err != nil {
		return asCNI(err, cniv1.CodeTryAgainLater)
	}
	cp := c.slots.table.copyOf(l)
	control.Note(ctx, "slot", cp.rec.Index)
	if cp.slot == nil {
		return cniErr(codes.FailedPrecondition, cniv1.CodeCheckFailed, fmt.Sprintf("slot %d: lost across a restart: %s", cp.rec.Index, cp.lostReason))
	}
	to, err := target(ctx, caller.Principal, req.Netns, req.IfName)
	if err != nil {
		return err
	}
	defer to.close()
	if err := to.sameAs(cp); err != nil {
		return asCNI(err, cniv1.CodeCheckFailed)
	}
	if _, err := c.slots.mgr.Attached(cp.slot, to.fd, req.IfName); err != nil {
		return cniErr(codes.FailedPrecondition, cniv1.CodeCheckFailed, err.Error())
	}
	return c.checkEgress(ctx, cp)
}

// checkEgress fails when the rules of lease l's egress policy are not the
// ones it records, on the host or in the slot's own namespace.
func (c *cniService) checkEgress(ctx context.Context, l lease) error {
	st, err := c.slots.mgr.InspectEgress(ctx, l.slot)
	if err != nil {
		return cniErr(codes.Internal, cniv1.CodeIOFailure, fmt.Sprintf("slot %d: read its egress rules: %v", l.rec.Index, err))
	}
	want := ""
	if pol := l.rec.Egress; pol != nil {
		want = pol.Fingerprint(c.slots.egress)
	}
	if drift := describeDrift(st, want); len(drift) > 0 {
		return cniErr(codes.FailedPrecondition, cniv1.CodeCheckFailed, fmt.Sprintf("slot %d: %s", l.rec.Index, strings.Join(drift, ", ")))
	}
	return nil
}

// gc ends every attachment of req.Network the runtime does not list as
// valid and its caller may end (its own; root, every one), and every
// lease of the Slots API squatting the network's keys, at once: their
// records in shared commits, their slots in the pool's batched teardown.
// What it may not end it keeps, and answers, with why.
func (c *cniService) gc(ctx context.Context, req cniv1.GCRequest) (cniv1.GCAnswer, error) {
	if err := checkNetwork(req.Network); err != nil {
		return cniv1.GCAnswer{}, err
	}
	owner := cniv1.Key{Network: req.Network}.Owner()
	caller, err := mayAttachFor(ctx, owner)
	if err != nil {
		return cniv1.GCAnswer{}, err
	}
	valid := make(map[string]bool, len(req.Valid))
	for _, v := range req.Valid {
		valid[cniv1.Key{ContainerID: v.ContainerID, IfName: v.IfName}.RequestID()] = true
	}
	var stale, kept []leases.Record
	for _, l := range c.slots.table.copies() {
		switch {
		case l.rec.Owner != owner || valid[l.rec.RequestID]:
		case whyKept(caller, l.rec) != "":
			kept = append(kept, l.rec)
		default:
			stale = append(stale, l.rec)
		}
	}
	byIndex := func(a, b leases.Record) int { return a.Index - b.Index }
	slices.SortFunc(stale, byIndex)
	slices.SortFunc(kept, byIndex)
	answer := cniv1.GCAnswer{Released: len(stale)}
	for _, rec := range kept {
		answer.Kept = append(answer.Kept, keptOf(rec, whyKept(caller, rec)))
	}
	control.Note(ctx, "released", len(stale))
	if len(kept) > 0 {
		control.Note(ctx, "kept", len(kept), "kept_by", keptBy(answer.Kept))
	}
	var g errgroup.Group
	g.SetLimit(gcWorkers)
	for _, rec := range stale {
		// GC answers once the slots are torn down: it is the runtime's
		// clean-up, and its measure against the kernel's floor.
		g.Go(func() error { return c.end(ctx, rec, c.slots.pool.Retire) })
	}
	if err := g.Wait(); err != nil {
		return cniv1.GCAnswer{}, asCNI(err, cniv1.CodeIOFailure)
	}
	if len(stale)+len(kept) > 0 {
		attrs := []any{"network", req.Network, "released", len(stale), "valid", len(req.Valid)}
		if len(kept) > 0 {
			attrs = append(attrs, "kept", len(kept), "kept_by", keptBy(answer.Kept))
		}
		c.slots.log.Info("attachments collected", attrs...)
	}
	return answer, nil
}

// status answers STATUS while the daemon serves (before, the route's gate
// answers): why the datapath is not whole, if it is not. A degraded
// daemon is an answer, not a refused call: runtimes poll STATUS, and the
// audit log must not fill with it.
func (c *cniService) status(ctx context.Context, _ struct{}) (cniv1.StatusAnswer, error) {
	if _, err := callerOf(ctx); err != nil {
		return cniv1.StatusAnswer{}, err
	}
	return cniv1.StatusAnswer{Degraded: c.degraded()}, nil
}

// attachTarget is the namespace an ADD attaches to, open, and the name
// the slot's end takes there.
type attachTarget struct {
	fd     int
	id     netns.ID
	path   string
	ifname string
}

// openTarget opens the runtime's namespace at path (following it, as the
// runtime named it) and checks that it is a network namespace: for root's
// call that passed none (target), and to find an attachment's namespace
// again at its end (unplug), whose answer goes to no caller.
func openTarget(path, ifname string) (*attachTarget, error) {
	if path == "" || !strings.HasPrefix(path, "/") || len(path) > leases.MaxAttachmentPath {
		return nil, cniErr(codes.InvalidArgument, cniv1.CodeInvalidEnvironment, fmt.Sprintf("CNI_NETNS %q: want the absolute path of the container's network namespace", path))
	}
	fd, err := netns.OpenForeign(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, cniErr(codes.NotFound, cniv1.CodeUnknownContainer, fmt.Sprintf("CNI_NETNS %s does not exist", path))
	case errors.Is(err, netns.ErrNotNamespace):
		return nil, cniErr(codes.InvalidArgument, cniv1.CodeInvalidEnvironment, fmt.Sprintf("CNI_NETNS %s: %v", path, err))
	case err != nil:
		return nil, cniErr(codes.Internal, cniv1.CodeIOFailure, fmt.Sprintf("CNI_NETNS %s: %v", path, err))
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, cniErr(codes.Internal, cniv1.CodeIOFailure, fmt.Sprintf("CNI_NETNS %s: fstat: %v", path, err))
	}
	return &attachTarget{fd: fd, id: netns.ID{Dev: st.Dev, Ino: st.Ino}, path: path, ifname: ifname}, nil
}

func (t *attachTarget) close() { unix.Close(t.fd) }

// record is the attachment's part of the lease record; nil for no target.
func (t *attachTarget) record() *leases.Attachment {
	if t == nil {
		return nil
	}
	return &leases.Attachment{Netns: t.id, NetnsPath: t.path, IfName: t.ifname}
}

// sameAs refuses a repeated ADD or a CHECK that names another namespace
// than the one the key's slot is attached to, or a lease that is not an
// attachment.
func (t *attachTarget) sameAs(l lease) error {
	a := l.rec.Attachment
	switch {
	case a == nil:
		return cniErr(codes.AlreadyExists, cniv1.CodeInvalidConfig, fmt.Sprintf("request \"%s\" of \"%s\" is a lease of the Slots API, not an attachment", names.Shown(l.rec.RequestID), names.Shown(l.rec.Owner)))
	case a.Netns != t.id:
		return cniErr(codes.AlreadyExists, cniv1.CodeInvalidEnvironment, fmt.Sprintf("%s of \"%s\" is attached to the namespace at %s, not to %s", names.Shown(l.rec.RequestID), names.Shown(l.rec.Owner), a.NetnsPath, t.path))
	}
	return nil
}

// attach gives slot sl an inside end in the target namespace. If that
// fails, the slot goes back to the pool: warm as it was when Attach
// refused before touching it, torn down and made again otherwise.
// hadPolicy says an egress policy was written for the lease.
func (s *slotsService) attach(ctx context.Context, sl *slot.Slot, to *attachTarget, hadPolicy bool) (*slot.Attachment, error) {
	made, err := s.mgr.Attach(ctx, sl, to.fd, to.ifname)
	if err == nil {
		return made, nil
	}
	untouched := errors.Is(err, slot.ErrIfNameTaken) || errors.Is(err, slot.ErrNotAttachable)
	if untouched {
		s.returnUnleased(sl, hadPolicy)
	} else if perr := s.pool.Put(context.WithoutCancel(ctx), sl); perr != nil {
		s.log.Warn("slot of a failed attach could not be made again", "slot", sl.Index, "error", perr)
	}
	switch {
	case errors.Is(err, slot.ErrIfNameTaken):
		return nil, cniErr(codes.AlreadyExists, cniv1.CodeIfNameTaken, err.Error())
	case errors.Is(err, slot.ErrNotAttachable):
		return nil, cniErr(codes.PermissionDenied, cniv1.CodeRefused, err.Error())
	case ctx.Err() != nil:
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	return nil, cniErr(codes.Internal, cniv1.CodeIOFailure, err.Error())
}

// unattach undoes an attachment whose lease could not be recorded: the
// new pair deleted (the container's end with it), and the slot torn down
// and made again.
func (s *slotsService) unattach(ctx context.Context, sl *slot.Slot) {
	bg := context.WithoutCancel(ctx)
	if err := s.mgr.Detach(bg, sl); err != nil {
		s.log.Warn("attachment not recorded could not be undone", "slot", sl.Index, "error", err)
	}
	if err := s.pool.Put(bg, sl); err != nil {
		s.log.Warn("slot of an attachment not recorded could not be made again", "slot", sl.Index, "error", err)
	}
}

// cniError is a refusal or failure in the CNI spec's terms, and a gRPC
// status for the guard's audit line and metric.
type cniError struct {
	grpc codes.Code
	e    cniv1.Error
}

func cniErr(grpc codes.Code, code uint, msg string) error {
	return &cniError{grpc: grpc, e: cniv1.Error{Code: code, Msg: msg}}
}

func (e *cniError) Error() string { return e.e.Error() }

// GRPCStatus makes the error a status for status.Convert.
func (e *cniError) GRPCStatus() *status.Status { return status.New(e.grpc, e.e.Error()) }

// asCNI returns err as a cniError: one already, or a gRPC status error of
// the Slots service mapped to the CNI code a runtime acts on (fallback for
// a code with no better one).
func asCNI(err error, fallback uint) *cniError {
	var ce *cniError
	if errors.As(err, &ce) {
		return ce
	}
	st := status.Convert(err)
	code := fallback
	switch st.Code() {
	case codes.InvalidArgument:
		code = cniv1.CodeInvalidConfig
	case codes.PermissionDenied, codes.Unauthenticated, codes.AlreadyExists:
		code = cniv1.CodeRefused
	case codes.ResourceExhausted, codes.Unavailable, codes.Aborted, codes.DeadlineExceeded, codes.Canceled:
		code = cniv1.CodeTryAgainLater
	}
	return &cniError{grpc: st.Code(), e: cniv1.Error{Code: code, Msg: st.Message()}}
}
