package phases

import (
	"net/http"
	"slices"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
	"github.com/phasegate/phasegate/control"
	"github.com/phasegate/phasegate/internal/names"
	"github.com/phasegate/phasegate/network/index"
)

// slotView is one moment of the slots' states: the pool's idle set, the
// index's states and the leases held, read once for a List or a Get.
type slotView struct {
	n      int
	idle   map[int]bool
	states []index.State
	held   map[int]*lease
}

func (s *slotsService) view() slotView {
	ps := s.pool.Snapshot()
	ss := s.pool.Indices()
	// A set, not a search of ps.Idle per index: List walks every index.
	idle := make(map[int]bool, len(ps.Idle))
	for _, i := range ps.Idle {
		idle[i] = true
	}
	return slotView{n: ss.N, idle: idle, states: ss.States, held: s.table.copies()}
}

// at is slot i's state and its lease, nil when it has none.
func (v slotView) at(i int) (phasegatev1.SlotState, *lease) {
	l := v.held[i]
	switch {
	case l != nil:
		return leaseState(l), l
	case v.idle[i]:
		return phasegatev1.SlotState_SLOT_STATE_WARM, nil
	case v.states[i-1] == index.Quarantined:
		return phasegatev1.SlotState_SLOT_STATE_QUARANTINED, nil
	case v.states[i-1] != index.Free:
		return phasegatev1.SlotState_SLOT_STATE_BUSY, nil // being made or torn down
	}
	return phasegatev1.SlotState_SLOT_STATE_FREE, nil
}

// states describes every slot (indices 1..N in order), or every slot that
// is not free, as caller c may see them: the leases of owners it may not
// read left out.
func (s *slotsService) states(includeFree bool, c control.Caller) []*phasegatev1.Slot {
	v := s.view()
	var out []*phasegatev1.Slot
	for i := 1; i <= v.n; i++ {
		st, l := v.at(i)
		if st == phasegatev1.SlotState_SLOT_STATE_FREE && !includeFree || l != nil && !c.Grant.MayRead(l.rec.Owner) {
			continue
		}
		out = append(out, s.describe(i, st, l, c))
	}
	return out
}

// describe is slot i in state st with lease l (nil: none), as caller c
// sees it.
func (s *slotsService) describe(i int, st phasegatev1.SlotState, l *lease, c control.Caller) *phasegatev1.Slot {
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
		out.Repaired = slices.Clone(l.repaired)
		out.Principal = l.rec.Principal
		out.EgressPolicy = egressProto(l.rec.Egress)
		if a := l.rec.Attachment; a != nil {
			out.AttachedNetnsPath = a.NetnsPath
			// The runtime never sees its attachment's lease id: the
			// principals that may release the lease learn it here.
			if mayAct(c, l.rec) {
				out.LeaseId = l.rec.LeaseID
			}
		}
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
// seeing what List shows it. The JSON is ASCII: a name recorded before
// the names rule is escaped, never shown as a look-alike.
func (s *slotsService) debugHandler() http.Handler {
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
