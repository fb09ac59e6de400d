package lease

import (
	"github.com/phasegate/phasegate/network/account"
	"github.com/phasegate/phasegate/network/index"
)

// State is a slot's state as Get and List show it.
type State uint8

// The states of a slot.
const (
	StateFree        State = iota // no slot at the index
	StateWarm                     // made, in the pool, not leased
	StateBusy                     // being made or torn down
	StateQuarantined              // kept out of use until the reconciler clears it
	StateAcquired                 // leased
	StateVerifying                // leased, restored at a start, not verified yet
	StateLost                     // leased, its slot gone
)

// Slot is one slot as Get and List answer it: its index, its state, and
// its lease (a copy; nil when it has none).
type Slot struct {
	Index int
	State State
	Lease *Lease
	// Repaired and EgressDrops are Get's alone: what of the slot's inside
	// was put back by this call, and how many packets its egress policy
	// dropped.
	Repaired    []string
	EgressDrops uint64
	// Usage is the lease's totals (usage.go): read now by Get, from one
	// listing of the host's links by List (whose drops are those of the
	// lease's earlier policies only); nil when not read.
	Usage *account.Usage
}

// slotView is one moment of the slots' states: the pool's idle set, the
// index's states and the leases held, read once for a List or a Get.
type slotView struct {
	n      int
	idle   map[int]bool
	states []index.State
	held   map[int]*Lease
}

func (s *Service) view() slotView {
	ps := s.pool.Snapshot()
	ss := s.pool.Indices()
	// A set, not a search of ps.Idle per index: List walks every index.
	idle := make(map[int]bool, len(ps.Idle))
	for _, i := range ps.Idle {
		idle[i] = true
	}
	return slotView{n: ss.N, idle: idle, states: ss.States, held: s.table.copies()}
}

// at is slot i as the view has it.
func (v slotView) at(i int) Slot {
	l := v.held[i]
	st := StateFree
	switch {
	case l != nil:
		st = l.State()
	case v.idle[i]:
		st = StateWarm
	case v.states[i-1] == index.Quarantined:
		st = StateQuarantined
	case v.states[i-1] != index.Free:
		st = StateBusy // being made or torn down
	}
	return Slot{Index: i, State: st, Lease: l}
}

// State is the state of a held lease's slot: read on a copy.
func (l *Lease) State() State {
	switch {
	case l.Slot == nil:
		return StateLost
	case l.check != nil:
		return StateVerifying
	}
	return StateAcquired
}
