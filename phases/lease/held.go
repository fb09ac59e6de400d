package lease

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/phasegate/phasegate/internal/names"
	"github.com/phasegate/phasegate/network/leases"
	"github.com/phasegate/phasegate/network/netns"
)

// HeldSlot is a slot kept as it is because something lives in it and no
// record vouches for it (DESIGN.md section 6, "When the records cannot
// vouch"): its records were lost, or it stands at a lost lease's index in
// place of the lease's slot. It is quarantined, and touched by nothing
// (the reconciler, a reclaim, a Create at its index) until an operator
// adopts it back as a lease or releases it (`phasegate held`).
type HeldSlot struct {
	Index int `json:"index"`
	// Netns is the identity of the namespace kept: the one bound at the
	// slot's netns file when it was held, or a lost lease's recorded one.
	Netns netns.ID `json:"netns"`
	// Reason says why no record vouches for it.
	Reason string    `json:"reason"`
	Since  time.Time `json:"since"`
	// Owner and RequestID are hints of the lease it may carry (what a
	// torn journal entry, or a lost lease's record, still told); empty
	// when nothing does.
	Owner     string `json:"owner,omitempty"`
	RequestID string `json:"request_id,omitempty"`
	// Stamp is the generation of the records its firewall element says it
	// was made under, when not this store's.
	Stamp string `json:"stamp,omitempty"`
	// LostLease: the index is still a lost lease's (LOST) until that
	// lease ends; the slot cannot be adopted or released before.
	LostLease bool `json:"lost_lease,omitempty"`
	// recorded: a Held record says so, which a later start reads.
	Recorded bool `json:"-"`
}

// Record is h's Held record.
func (h HeldSlot) Record() leases.Record {
	return leases.Record{Index: h.Index, State: leases.Held, Netns: h.Netns, Owner: h.Owner, RequestID: h.RequestID,
		HeldSince: h.Since, HeldReason: truncate(h.Reason, leases.MaxIDLen)}
}

// HeldFrom is the held slot a Held record names.
func HeldFrom(rec leases.Record) HeldSlot {
	return HeldSlot{Index: rec.Index, Netns: rec.Netns, Reason: rec.HeldReason, Since: rec.HeldSince,
		Owner: rec.Owner, RequestID: rec.RequestID, Recorded: true}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// HeldSlots are the slots held now, by index: filled by the restore,
// added to by the check of the restored leases, emptied by the operator.
// Its mutex guards the map only.
type HeldSlots struct {
	// Ops serialises the operator's adopt and release (the held slots'
	// routes), each of which takes seconds of kernel work at most.
	Ops sync.Mutex

	mu sync.Mutex
	at map[int]HeldSlot
	// warn shows the held slots in health (the lifecycle's warning).
	warn Warnings
}

// NewHeldSlots returns the held slots, those of held to begin with,
// shown in health through warn.
func NewHeldSlots(warn Warnings, held []HeldSlot) *HeldSlots {
	h := &HeldSlots{at: map[int]HeldSlot{}, warn: warn}
	for _, s := range held {
		h.at[s.Index] = s
	}
	h.report()
	return h
}

// Has reports whether index i is held: the reconciler's Keep.
func (h *HeldSlots) Has(i int) bool {
	if h == nil {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok := h.at[i]
	return ok
}

// Get returns the held slot at i.
func (h *HeldSlots) Get(i int) (HeldSlot, bool) {
	if h == nil {
		return HeldSlot{}, false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	s, ok := h.at[i]
	return s, ok
}

// List returns every held slot, by index.
func (h *HeldSlots) List() []HeldSlot {
	if h == nil {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]HeldSlot, 0, len(h.at))
	for _, i := range slices.Sorted(maps.Keys(h.at)) {
		out = append(out, h.at[i])
	}
	return out
}

// Put holds s (or replaces what was held at its index).
func (h *HeldSlots) Put(s HeldSlot) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.at[s.Index] = s
	h.reportLocked()
}

// Remove forgets the slot held at i.
func (h *HeldSlots) Remove(i int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.at, i)
	h.reportLocked()
}

// report puts the held slots in health, or clears the warning once none
// is left.
func (h *HeldSlots) report() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.reportLocked()
}

// reportLocked is report with h.mu held: two changes' Warnings never
// overtake each other.
func (h *HeldSlots) reportLocked() {
	if h.warn == nil {
		return
	}
	if len(h.at) == 0 {
		h.warn.ClearWarning(WarnHeld)
		return
	}
	l := make([]HeldSlot, 0, len(h.at))
	for _, i := range slices.Sorted(maps.Keys(h.at)) {
		l = append(l, h.at[i])
	}
	h.warn.Warn(WarnHeld, heldMessage(l))
}

// heldMessage is the held-slots warning: every index, with the owner a
// hint names.
func heldMessage(l []HeldSlot) string {
	var parts []string
	for _, s := range l {
		p := fmt.Sprint(s.Index)
		if s.Owner != "" {
			p += " (owner " + names.Shown(s.Owner) + ")"
		}
		parts = append(parts, p)
	}
	return fmt.Sprintf("%d slots held: something lives in them and no record vouches for them (slots %s); `phasegate held` lists them, adopts them back or releases them",
		len(l), strings.Join(parts, ", "))
}

// The names of the health warnings the lease core shows.
const (
	WarnHeld        = "held-slots"   // slots held for the operator
	WarnLeasesLost  = "leases-lost"  // restored leases found lost
	WarnSlotsBroken = "slots-broken" // leased slots broken from outside
)
