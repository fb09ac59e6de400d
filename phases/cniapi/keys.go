package cniapi

import (
	"fmt"
	"slices"
	"strings"

	"google.golang.org/grpc/codes"

	cniv1 "github.com/phasegate/phasegate/api/cni/v1"
	"github.com/phasegate/phasegate/control"
	"github.com/phasegate/phasegate/internal/names"
	"github.com/phasegate/phasegate/network/leases"
	"github.com/phasegate/phasegate/phases/lease"
)

// Who holds a CNI key, and who may end what holds it (DESIGN.md §11,
// SECURITY.md "The CNI plugin").
//
// A key (network, container id, ifname) is held by the lease of owner
// "cni/<network>" and request id "<container id>/<ifname>" (cniv1.Key).
// Only an ADD makes such a lease, for a principal granted attach for the
// network: Acquire refuses every owner under "cni/", whatever its request
// id and whoever asks (refuseCNIOwner), so no other door leads into a
// network's keys, and a grant to lease "cni/*" takes none. A lease of the
// Slots API found under such an owner was taken before that rule: it
// squats the network's keys, and a principal granted attach for the
// network ends it (DEL of its key, or GC).
//
// An attachment is its principal's. Another principal granted attach for
// the same network shares the network's name, not its attachments: only
// the attachment's principal and root end or change it (mayAct), and
// another's ADD of its key is refused naming who holds it (keyTaken).
// Root is the one principal that owns every network: it writes the
// policy, and it could remove the namespaces without asking anyway.

// keyTaken refuses an ADD of key k by caller c when lease l, which holds
// the key, is not c's attachment: it names the holder, and what ends it.
// c's own attachment is a repeated ADD's to answer (acquire).
func keyTaken(c control.Caller, k cniv1.Key, l lease.Lease) error {
	key := fmt.Sprintf("key %s of network %q", names.Shown(k.RequestID()), k.Network)
	switch {
	case l.Rec.Attachment == nil:
		return cniErr(codes.AlreadyExists, cniv1.CodeRefused, fmt.Sprintf(
			"%s is held by slot %d, a lease of the Slots API of %s taken before CNI keys were ADD's alone: a DEL of the key by a principal granted attach for %s ends it",
			key, l.Rec.Index, names.Shown(l.Rec.Principal), k.Owner()))
	case l.Rec.Principal != c.Principal.String():
		return cniErr(codes.AlreadyExists, cniv1.CodeRefused, fmt.Sprintf(
			"%s is held by slot %d, %s's attachment to %s: only %s or root may end it (DEL)",
			key, l.Rec.Index, names.Shown(l.Rec.Principal), names.Shown(l.Rec.Attachment.NetnsPath), names.Shown(l.Rec.Principal)))
	}
	return nil
}

// whyKept says why caller c, granted attach for the network of lease rec,
// may not end it (DEL, GC); "" if it may.
func whyKept(c control.Caller, rec leases.Record) string {
	if rec.Attachment == nil || lease.MayAct(c, rec) {
		return ""
	}
	p := names.Shown(rec.Principal)
	return fmt.Sprintf("%s's attachment: only %s or root may end it", p, p)
}

// keptOf is GC's account of rec, kept for why.
func keptOf(rec leases.Record, why string) cniv1.KeptAttachment {
	k := cniv1.KeptAttachment{Principal: names.Shown(rec.Principal), Reason: why}
	k.ContainerID, k.IfName, _ = strings.Cut(rec.RequestID, "/")
	return k
}

// keptBy lists the principals of kept, once each, sorted: the audit
// line's account of what a GC left.
func keptBy(kept []cniv1.KeptAttachment) string {
	var ps []string
	for _, k := range kept {
		ps = append(ps, k.Principal)
	}
	slices.Sort(ps)
	return strings.Join(slices.Compact(ps), ",")
}
