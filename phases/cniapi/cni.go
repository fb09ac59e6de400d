package cniapi

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
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
	"github.com/phasegate/phasegate/network/shape"
	"github.com/phasegate/phasegate/network/slot"
	"github.com/phasegate/phasegate/phases/lease"
	"github.com/phasegate/phasegate/phases/slotsapi"
)

// Service serves the CNI plugin's calls (cmd/phasegate-cni, DESIGN.md
// §11) over the lease core: an attachment is a lease of owner
// "cni/<network>" and request "<container id>/<ifname>" whose slot's
// inside end lives in the runtime's namespace. Every call comes through
// the control socket's guard, under the method names of [Methods].
type Service struct {
	slots *lease.Service
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
	c, err := slotsapi.CallerOf(ctx)
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
func (c *Service) add(ctx context.Context, req cniv1.AddRequest) (*cniv1.Attachment, error) {
	if err := checkNewKey(req.Key); err != nil {
		return nil, err
	}
	caller, err := mayAttach(ctx, req.Key)
	if err != nil {
		return nil, err
	}
	pol, cost, err := egressOf(req, c.slots.EgressDefaults())
	if err != nil {
		return nil, asCNI(err, cniv1.CodeInvalidConfig)
	}
	published, err := lease.ParsePorts(req.Ports)
	if err != nil {
		return nil, asCNI(err, cniv1.CodeInvalidConfig)
	}
	bw, err := bandwidthOf(req.Bandwidth)
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
		return nil, asCNI(lease.FromContext(err), cniv1.CodeTryAgainLater)
	}
	defer unlock()
	if l, ok := c.slots.ByRequest(owner, requestID); ok {
		if err := keyTaken(caller, req.Key, l); err != nil {
			return nil, err
		}
	}
	a, err := c.slots.Attach(ctx, caller, lease.Request{Owner: owner, RequestID: requestID, Egress: pol, Ports: published, Bandwidth: bw, Attach: to})
	if err != nil {
		return nil, asCNI(err, cniv1.CodeIOFailure)
	}
	l := a.Lease
	control.Note(ctx, "slot", l.Rec.Index, "retry", a.Retry)
	if l.Slot == nil {
		return nil, cniErr(codes.FailedPrecondition, cniv1.CodeCheckFailed,
			fmt.Sprintf("attachment %s/%s of %q was lost across a restart (%s): DEL it, then ADD again", req.ContainerID, req.IfName, req.Network, l.LostReason))
	}
	made := a.Made
	if made == nil {
		// A repeated ADD answers what the first one made, as it is now.
		if made, err = c.slots.Manager().Attached(l.Slot, to.fd, req.IfName); err != nil {
			return nil, cniErr(codes.FailedPrecondition, cniv1.CodeCheckFailed, err.Error())
		}
	}
	return attachmentOf(l.Slot, made, req.Netns), nil
}

// attachmentOf is ADD's answer for slot s attached as a in the namespace at
// path.
func attachmentOf(s *slot.Slot, a *slot.Attachment, path string) *cniv1.Attachment {
	out := &cniv1.Attachment{
		Slot: s.Index, HostIf: s.HostIf, HostMAC: a.HostMAC.String(),
		IfName: a.IfName, MAC: a.MAC.String(), Netns: path,
		Address: s.InsideAddr.String(), Gateway: s.HostAddr.Addr().String(),
	}
	if s.InsideAddr6.IsValid() {
		out.Address6, out.Gateway6 = s.InsideAddr6.String(), s.HostAddr6.Addr().String()
	}
	return out
}

// bandwidthOf is ADD's bandwidth limits (nil: none), checked as the
// Slots API's.
func bandwidthOf(b *cniv1.Bandwidth) (*shape.Limits, error) {
	if b == nil || *b == (cniv1.Bandwidth{}) {
		// A runtime that declares the capability passes it empty for a
		// container without limits.
		return nil, nil
	}
	return lease.ParseBandwidth(&shape.Limits{IngressRate: b.IngressRate, IngressBurst: givenBurst(b.IngressBurst), EgressRate: b.EgressRate,
		EgressBurst: givenBurst(b.EgressBurst)})
}

// givenBurst is a burst the runtime gave, 0 (the default) for the
// largest 32-bit values: what Kubernetes' runtimes pass for a pod whose
// annotations give a rate alone, which at a rate of a few Mbit/s is
// minutes of traffic, more than tbf can hold.
func givenBurst(b uint64) uint64 {
	if b == math.MaxUint32 || b == math.MaxInt32 {
		return 0
	}
	return b
}

// egressOf is ADD's egress policy (nil: none) over the daemon's part d,
// and what it costs of the caller's rate: the network's policy, narrowed by the container's own
// when the runtime passed one (egress.Narrow: the attachment lets out
// only what both let out). It costs as many calls as the larger of what
// it was given and what it is.
func egressOf(req cniv1.AddRequest, d egress.Defaults) (*egress.Policy, int, error) {
	network, err := parseEgress(req.Egress, d)
	if err != nil {
		return nil, 0, err
	}
	container, err := parseEgress(req.ContainerEgress, d)
	if err != nil {
		return nil, 0, cniErr(codes.InvalidArgument, cniv1.CodeInvalidConfig, "the container's "+err.Error())
	}
	pol, err := egress.Narrow(network, container, d)
	if err != nil {
		return nil, 0, cniErr(codes.InvalidArgument, cniv1.CodeInvalidConfig, err.Error())
	}
	return pol, max(lease.EgressCost(pol), lease.EgressCost(network)+lease.EgressCost(container)), nil
}

// parseEgress checks the plugin's egress policy; nil is none.
func parseEgress(e *cniv1.Egress, d egress.Defaults) (*egress.Policy, error) {
	return lease.ParseEgress(e, d)
}

// del ends the attachment of req's key: an unknown key, one ended
// meanwhile and one whose container's namespace is gone are all success.
// Another principal's attachment is refused, naming it (cnikeys.go); a
// lease of the Slots API that squats the key is ended.
func (c *Service) del(ctx context.Context, req cniv1.DelRequest) error {
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
		return asCNI(lease.FromContext(err), cniv1.CodeTryAgainLater)
	}
	defer unlock()
	l, ok := c.slots.ByRequest(req.Owner(), req.RequestID())
	if !ok {
		return nil
	}
	rec := l.Rec
	control.Note(ctx, "slot", rec.Index)
	if why := whyKept(caller, rec); why != "" {
		return cniErr(codes.PermissionDenied, cniv1.CodeRefused, fmt.Sprintf("attachment %s of network %q: %s", names.Shown(req.RequestID()), req.Network, why))
	}
	if rec.Attachment == nil {
		control.Note(ctx, "squatted_by", names.Shown(rec.Principal))
		c.slots.Log().Warn("a lease of the Slots API held a CNI key: DEL ends it", "slot", rec.Index, "owner", names.Shown(rec.Owner),
			"request_id", names.Shown(rec.RequestID), "principal", names.Shown(rec.Principal))
	}
	return c.end(ctx, rec, c.slots.Pool().Discard)
}

// end ends the attachment recorded as rec, unless its lease ended (and
// perhaps a new one began at its index) meanwhile, and gives its slot to
// the pool through put.
func (c *Service) end(ctx context.Context, rec leases.Record, put func(context.Context, *slot.Slot) error) error {
	// The attachment is cut off before put (its host end deleted, the
	// container's end with it). With pool.Discard, DEL answers then: the
	// teardown of the slot's own namespace and the replacement are the
	// pool's, not the runtime's to wait for, and the index comes back only
	// once the teardown is done (or stays quarantined for the reconciler).
	ended, err := c.slots.End(ctx, rec, put)
	if err != nil {
		return asCNI(err, cniv1.CodeIOFailure)
	}
	if ended {
		c.slots.Log().Info("attachment ended", "slot", rec.Index, "owner", names.Shown(rec.Owner), "request_id", names.Shown(rec.RequestID))
	}
	return nil
}

// check fails naming what differs from what ADD made.
func (c *Service) check(ctx context.Context, req cniv1.CheckRequest) error {
	if err := checkKey(req.Key); err != nil {
		return err
	}
	caller, err := mayAttach(ctx, req.Key)
	if err != nil {
		return err
	}
	cp, ok, err := c.slots.SettledByRequest(ctx, req.Owner(), req.RequestID())
	switch {
	case !ok:
		return cniErr(codes.NotFound, cniv1.CodeCheckFailed, fmt.Sprintf("no attachment %s on network %q", names.Shown(req.RequestID()), req.Network))
	case err != nil:
		return asCNI(err, cniv1.CodeTryAgainLater)
	}
	control.Note(ctx, "slot", cp.Rec.Index)
	if cp.Slot == nil {
		return cniErr(codes.FailedPrecondition, cniv1.CodeCheckFailed, fmt.Sprintf("slot %d: lost across a restart: %s", cp.Rec.Index, cp.LostReason))
	}
	to, err := target(ctx, caller.Principal, req.Netns, req.IfName)
	if err != nil {
		return err
	}
	defer to.close()
	if err := to.SameAs(cp); err != nil {
		return asCNI(err, cniv1.CodeCheckFailed)
	}
	if _, err := c.slots.Manager().Attached(cp.Slot, to.fd, req.IfName); err != nil {
		return cniErr(codes.FailedPrecondition, cniv1.CodeCheckFailed, err.Error())
	}
	return c.checkEgress(ctx, cp)
}

// checkEgress fails when the rules of lease l's egress policy are not the
// ones it records, on the host or in the slot's own namespace.
func (c *Service) checkEgress(ctx context.Context, l lease.Lease) error {
	st, err := c.slots.Manager().InspectEgress(ctx, l.Slot)
	if err != nil {
		return cniErr(codes.Internal, cniv1.CodeIOFailure, fmt.Sprintf("slot %d: read its egress rules: %v", l.Rec.Index, err))
	}
	want := ""
	if pol := l.Rec.Egress; pol != nil {
		want = pol.Fingerprint(c.slots.EgressDefaults())
	}
	if drift := lease.DescribeDrift(st, want); len(drift) > 0 {
		return cniErr(codes.FailedPrecondition, cniv1.CodeCheckFailed, fmt.Sprintf("slot %d: %s", l.Rec.Index, strings.Join(drift, ", ")))
	}
	return nil
}

// gc ends every attachment of req.Network the runtime does not list as
// valid and its caller may end (its own; root, every one), and every
// lease of the Slots API squatting the network's keys, at once: their
// records in shared commits, their slots in the pool's batched teardown.
// What it may not end it keeps, and answers, with why.
func (c *Service) gc(ctx context.Context, req cniv1.GCRequest) (cniv1.GCAnswer, error) {
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
	for _, l := range c.slots.Leases() {
		switch {
		case l.Rec.Owner != owner || valid[l.Rec.RequestID]:
		case whyKept(caller, l.Rec) != "":
			kept = append(kept, l.Rec)
		default:
			stale = append(stale, l.Rec)
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
		g.Go(func() error { return c.end(ctx, rec, c.slots.Pool().Retire) })
	}
	if err := g.Wait(); err != nil {
		return cniv1.GCAnswer{}, asCNI(err, cniv1.CodeIOFailure)
	}
	if len(stale)+len(kept) > 0 {
		attrs := []any{"network", req.Network, "released", len(stale), "valid", len(req.Valid)}
		if len(kept) > 0 {
			attrs = append(attrs, "kept", len(kept), "kept_by", keptBy(answer.Kept))
		}
		c.slots.Log().Info("attachments collected", attrs...)
	}
	return answer, nil
}

// status answers STATUS while the daemon serves (before, the route's gate
// answers): why the datapath is not whole, if it is not. A degraded
// daemon is an answer, not a refused call: runtimes poll STATUS, and the
// audit log must not fill with it.
func (c *Service) status(ctx context.Context, _ struct{}) (cniv1.StatusAnswer, error) {
	if _, err := slotsapi.CallerOf(ctx); err != nil {
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
// call that passed none (target).
func openTarget(path, ifname string) (*attachTarget, error) {
	if path == "" || !strings.HasPrefix(path, "/") || len(path) > leases.MaxAttachmentPath {
		return nil, cniErr(codes.InvalidArgument, cniv1.CodeInvalidEnvironment, fmt.Sprintf("CNI_NETNS %q: want the absolute path of the container's network namespace", path))
	}
	fd, id, err := lease.OpenNetns(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, cniErr(codes.NotFound, cniv1.CodeUnknownContainer, fmt.Sprintf("CNI_NETNS %s does not exist", path))
	case errors.Is(err, netns.ErrNotNamespace):
		return nil, cniErr(codes.InvalidArgument, cniv1.CodeInvalidEnvironment, fmt.Sprintf("CNI_NETNS %s: %v", path, err))
	case err != nil:
		return nil, cniErr(codes.Internal, cniv1.CodeIOFailure, fmt.Sprintf("CNI_NETNS %s: %v", path, err))
	}
	return &attachTarget{fd: fd, id: id, path: path, ifname: ifname}, nil
}

func (t *attachTarget) close() { unix.Close(t.fd) }

// Record is the attachment's part of the lease record.
func (t *attachTarget) Record() *leases.Attachment {
	return &leases.Attachment{Netns: t.id, NetnsPath: t.path, IfName: t.ifname}
}

// SameAs refuses a repeated ADD or a CHECK that names another namespace
// than the one the key's slot is attached to, or a lease that is not an
// attachment.
func (t *attachTarget) SameAs(l lease.Lease) error {
	a := l.Rec.Attachment
	switch {
	case a == nil:
		return cniErr(codes.AlreadyExists, cniv1.CodeInvalidConfig, fmt.Sprintf("request \"%s\" of \"%s\" is a lease of the Slots API, not an attachment", names.Shown(l.Rec.RequestID), names.Shown(l.Rec.Owner)))
	case a.Netns != t.id:
		return cniErr(codes.AlreadyExists, cniv1.CodeInvalidEnvironment, fmt.Sprintf("%s of \"%s\" is attached to the namespace at %s, not to %s", names.Shown(l.Rec.RequestID), names.Shown(l.Rec.Owner), a.NetnsPath, t.path))
	}
	return nil
}

// Attach gives slot sl an inside end in the target namespace.
func (t *attachTarget) Attach(ctx context.Context, m *slot.Manager, sl *slot.Slot) (*slot.Attachment, error) {
	return m.Attach(ctx, sl, t.fd, t.ifname)
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

// cniCodeOf is the CNI code of each kind of the lease core's errors a
// runtime acts on: the one table of the plugin's answers (a kind not
// here takes the call's fallback).
var cniCodeOf = map[lease.Kind]uint{
	lease.ErrInvalid:         cniv1.CodeInvalidConfig,
	lease.ErrDenied:          cniv1.CodeRefused,
	lease.ErrUnauthenticated: cniv1.CodeRefused,
	lease.ErrExists:          cniv1.CodeRefused,
	lease.ErrExhausted:       cniv1.CodeTryAgainLater,
	lease.ErrUnavailable:     cniv1.CodeTryAgainLater,
	lease.ErrAborted:         cniv1.CodeTryAgainLater,
	lease.ErrDeadline:        cniv1.CodeTryAgainLater,
	lease.ErrCanceled:        cniv1.CodeTryAgainLater,
}

// asCNI returns err as a cniError: one already, or an error of the lease
// core (or a status of the guard's) mapped to the CNI code a runtime acts
// on (fallback for a kind with no better one), and to the gRPC code of
// the guard's audit line (slotsapi's table).
func asCNI(err error, fallback uint) *cniError {
	var ce *cniError
	if errors.As(err, &ce) {
		return ce
	}
	st := status.Convert(slotsapi.Status(err))
	k := slotsapi.KindOf(st.Code())
	code, ok := cniCodeOf[k]
	switch {
	case errors.Is(err, slot.ErrIfNameTaken):
		code = cniv1.CodeIfNameTaken
	case !ok:
		code = fallback
	}
	return &cniError{grpc: st.Code(), e: cniv1.Error{Code: code, Msg: st.Message()}}
}
