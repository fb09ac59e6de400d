package slotsapi

import (
	"net/http"
	"slices"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
	"github.com/phasegate/phasegate/control"
	"github.com/phasegate/phasegate/internal/names"
	"github.com/phasegate/phasegate/phases/lease"
)

// states describes every slot (indices 1..N in order), or every slot that
// is not free, as caller c may see them.
func (s *Server) states(includeFree bool, c control.Caller) []*phasegatev1.Slot {
	var out []*phasegatev1.Slot
	for _, sl := range s.leases.List(c, includeFree) {
		out = append(out, s.describe(sl, c))
	}
	return out
}

// stateOf is the proto of each slot state.
var stateOf = [...]phasegatev1.SlotState{
	lease.StateFree:        phasegatev1.SlotState_SLOT_STATE_FREE,
	lease.StateWarm:        phasegatev1.SlotState_SLOT_STATE_WARM,
	lease.StateBusy:        phasegatev1.SlotState_SLOT_STATE_BUSY,
	lease.StateQuarantined: phasegatev1.SlotState_SLOT_STATE_QUARANTINED,
	lease.StateAcquired:    phasegatev1.SlotState_SLOT_STATE_ACQUIRED,
	lease.StateVerifying:   phasegatev1.SlotState_SLOT_STATE_VERIFYING,
	lease.StateLost:        phasegatev1.SlotState_SLOT_STATE_LOST,
}

// describe is slot v as caller c sees it.
func (s *Server) describe(v lease.Slot, c control.Caller) *phasegatev1.Slot {
	cfg := s.leases.Config()
	sl, l := cfg.Slot(v.Index), v.Lease
	out := &phasegatev1.Slot{
		Index:           uint32(v.Index),
		State:           stateOf[v.State],
		NetnsName:       sl.NetnsName,
		NetnsPath:       sl.NetnsPath,
		HostInterface:   sl.HostIf,
		InsideInterface: sl.InsideIf,
		HostAddress:     sl.HostAddr.String(),
		InsideAddress:   sl.InsideAddr.String(),
	}
	if sl.HostAddr6.IsValid() {
		out.HostAddress6, out.InsideAddress6 = sl.HostAddr6.String(), sl.InsideAddr6.String()
	}
	if g := cfg.Guest; g.Enabled() {
		out.GuestInterface, out.GuestAddress, out.GuestGateway = g.Tap, g.Addr.String(), g.Gateway.String()
	}
	if l != nil {
		out.Owner = l.Rec.Owner
		out.AcquiredAt = timestamppb.New(l.Rec.Acquired)
		out.RequestId = l.Rec.RequestID
		out.Ttl = durationpb.New(l.Rec.TTL)
		if !l.Rec.Expires.IsZero() {
			out.ExpiresAt = timestamppb.New(l.Rec.Expires)
		}
		out.LostReason = l.LostReason
		out.Repaired = slices.Clone(l.Repaired)
		out.Principal = l.Rec.Principal
		out.EgressPolicy = egressProto(l.Rec.Egress)
		out.Ports = portsProto(l.Rec.Ports)
		out.Bandwidth = bandwidthProto(l.Rec.Bandwidth)
		if a := l.Rec.Attachment; a != nil {
			out.AttachedNetnsPath = a.NetnsPath
			// The runtime never sees its attachment's lease id: the
			// principals that may release the lease learn it here.
			if lease.MayAct(c, l.Rec) {
				out.LeaseId = l.Rec.LeaseID
			}
		}
	}
	if u := v.Usage; u != nil {
		out.Usage = &phasegatev1.Usage{BytesIn: u.BytesIn, PacketsIn: u.PacketsIn, BytesOut: u.BytesOut, PacketsOut: u.PacketsOut,
			DroppedPackets: u.Dropped}
	}
	return out
}

// DebugHandler serves List as JSON at /debug/slots (?all=1 adds free ones)
// on the control surface, behind its guard ([control.Guard.HTTP]: the
// caller identified, within its rate, granted something), each caller
// seeing what List shows it. The JSON is ASCII: a name recorded before
// the names rule is escaped, never shown as a look-alike.
func (s *Server) DebugHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, ok := control.CallerFrom(r.Context())
		if !ok {
			http.Error(w, "the slots are listed only on the control surface", http.StatusUnauthorized)
			return
		}
		list := &phasegatev1.ListResponse{Slots: s.states(r.URL.Query().Has("all"), c)}
		b, err := protojson.MarshalOptions{Multiline: true, UseProtoNames: true}.Marshal(list)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_, _ = w.Write(append(names.ASCIIJSON(b), '\n'))
	})
}
