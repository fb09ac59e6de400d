package phases

import (
	"net/http"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
	"github.com/phasegate/phasegate/control"
	"github.com/phasegate/phasegate/network/index"
)

// states describes every slot (indices 1..N in order), or every slot that is
// not free, leaving out the leases of owners mayRead refuses.
func (s *slotsService) states(includeFree bool, mayRead func(owner string) bool) []*phasegatev1.Slot {
	ps := s.pool.Snapshot()
	ss := s.pool.Indices()
	held := s.table.copies()

	// A set, not a search of ps.Idle per index: List walks every index.
	idle := make(map[int]bool, len(ps.Idle))
	for _, i := range ps.Idle {
		idle[i] = true
	}
	var out []*phasegatev1.Slot
	for i := 1; i <= ss.N; i++ {
		st := phasegatev1.SlotState_SLOT_STATE_FREE
		l := held[i]
		switch {
		case l != nil:
			st = leaseState(l)
		case idle[i]:
			st = phasegatev1.SlotState_SLOT_STATE_WARM
		case ss.States[i-1] == index.Quarantined:
			st = phasegatev1.SlotState_SLOT_STATE_QUARANTINED
		case ss.States[i-1] != index.Free:
			st = phasegatev1.SlotState_SLOT_STATE_BUSY // being made or torn down
		}
		if st == phasegatev1.SlotState_SLOT_STATE_FREE && !includeFree || l != nil && !mayRead(l.rec.Owner) {
			continue
		}
		out = append(out, s.describe(i, st, l))
	}
	return out
}

func (s *slotsService) describe(i int, st phasegatev1.SlotState, l *lease) *phasegatev1.Slot {
	sl := s.cfg.Slot(i)
	out := &phasegatev1.Slot{
		Index:           uint32(i),
		State:           st,
		NetnsName:       sl.NetnsName,
		NetnsPath:       sl.NetnsPath,
		HostInterface:   sl.HostIf,
		InsideInterface: sl.InsideIf,
		HostAddress:     sl.HostAddr.String(),
		InsideAddress:   sl.InsideAddr.String(),
	}
	if g := s.cfg.Guest; g.Enabled() {
		out.GuestInterface, out.GuestAddress, out.GuestGateway = g.Tap, g.Addr.String(), g.Gateway.String()
	}
	if l != nil {
		out.Owner = l.rec.Owner
		out.AcquiredAt = timestamppb.New(l.rec.Acquired)
		out.RequestId = l.rec.RequestID
		out.Ttl = durationpb.New(l.rec.TTL)
		if !l.rec.Expires.IsZero() {
			out.ExpiresAt = timestamppb.New(l.rec.Expires)
		}
		out.LostReason = l.lostReason
		out.Principal = l.rec.Principal
		out.EgressPolicy = egressProto(l.rec.Egress)
	}
	return out
}

// leaseState is the state of a held lease's slot. l's fields are read
// under slotsService.mu, or on a copy made under it.
func leaseState(l *lease) phasegatev1.SlotState {
	switch {
	case l.slot == nil:
		return phasegatev1.SlotState_SLOT_STATE_LOST
	case l.check != nil:
		return phasegatev1.SlotState_SLOT_STATE_VERIFYING
	}
	return phasegatev1.SlotState_SLOT_STATE_ACQUIRED
}

// debugHandler serves List as JSON at /debug/slots (?all=1 adds free ones)
// on the control surface, behind its guard ([control.Guard.HTTP]: the
// caller identified, within its rate, granted something), each caller
// seeing what List shows it.
func (s *slotsService) debugHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, ok := control.CallerFrom(r.Context())
		if !ok {
			http.Error(w, "the slots are listed only on the control surface", http.StatusUnauthorized)
			return
		}
		list := &phasegatev1.ListResponse{Slots: s.states(r.URL.Query().Has("all"), c.Grant.MayRead)}
		b, err := protojson.MarshalOptions{Multiline: true, UseProtoNames: true}.Marshal(list)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_, _ = w.Write(append(b, '\n'))
	})
}
