package index

import (
	"errors"
	"fmt"
	"slices"
	"sync"
)

// Errors callers branch on. They are wrapped with the index concerned.
var (
	// ErrExhausted: no free index.
	ErrExhausted = errors.New("index: no free slot index")
	// ErrOutOfRange: the index is not in [1, N].
	ErrOutOfRange = errors.New("index: out of range")
	// ErrNotAcquired: Release of an index that is not acquired (double
	// release, or never acquired).
	ErrNotAcquired = errors.New("index: not acquired")
	// ErrNotQuarantined: Free of an index that is not quarantined.
	ErrNotQuarantined = errors.New("index: not quarantined")
)

// State is the state of one index.
type State uint8

// The states of an index.
const (
	// Free: can be acquired.
	Free State = iota
	// Acquired: handed out (to the pool, or by the pool to a user).
	Acquired
	// Quarantined: something of the slot may still exist on the host; only
	// the reconciler may free it.
	Quarantined
)

// String returns the state's name.
func (s State) String() string {
	switch s {
	case Free:
		return "free"
	case Acquired:
		return "acquired"
	case Quarantined:
		return "quarantined"
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

// Allocator allocates slot indices. The zero value is not usable; call New.
type Allocator struct {
	mu    sync.Mutex
	state []State // state[i] for i in [1, n]; state[0] unused
	free  []int   // stack of free indices; lowest on top on a fresh allocator
	pos   []int32 // pos[i]: position of i in free, or -1
	n     int
	acq   int
	quar  int
}

// New returns an allocator over [1, n] in which the given indices are
// quarantined (duplicates are fine; indices outside [1, n] are an error).
func New(n int, quarantined []int) (*Allocator, error) {
	if n < 1 {
		return nil, fmt.Errorf("index: need at least one index, got %d", n)
	}
	s := &Allocator{
		n:     n,
		state: make([]State, n+1),
		pos:   make([]int32, n+1),
		free:  make([]int, 0, n),
	}
	for _, i := range quarantined {
		if i < 1 || i > n {
			return nil, fmt.Errorf("%w: quarantined index %d not in [1, %d]", ErrOutOfRange, i, n)
		}
		if s.state[i] != Quarantined {
			s.state[i] = Quarantined
			s.quar++
		}
	}
	for i := n; i >= 1; i-- {
		s.pos[i] = -1
		if s.state[i] == Free {
			s.push(i)
		}
	}
	return s, nil
}

func (s *Allocator) push(i int) {
	s.pos[i] = int32(len(s.free))
	s.free = append(s.free, i)
}

// remove takes i out of the free stack in O(1) (swap with the top).
func (s *Allocator) remove(i int) {
	p := s.pos[i]
	last := len(s.free) - 1
	top := s.free[last]
	s.free[p] = top
	s.pos[top] = p
	s.free = s.free[:last]
	s.pos[i] = -1
}

func (s *Allocator) check(i int) error {
	if i < 1 || i > s.n {
		return fmt.Errorf("%w: %d not in [1, %d]", ErrOutOfRange, i, s.n)
	}
	return nil
}

// set moves index i from its state to to, keeping the free stack and the
// counts with it.
func (s *Allocator) set(i int, to State) {
	switch s.state[i] {
	case Free:
		s.remove(i)
	case Acquired:
		s.acq--
	case Quarantined:
		s.quar--
	}
	s.state[i] = to
	switch to {
	case Free:
		s.push(i)
	case Acquired:
		s.acq++
	case Quarantined:
		s.quar++
	}
}

// move moves index i, which must be in state from, to state to; an index
// in another state is refused with refuse's error, naming that state.
func (s *Allocator) move(i int, from, to State, refuse func(now State) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.check(i); err != nil {
		return err
	}
	if s.state[i] != from {
		return refuse(s.state[i])
	}
	s.set(i, to)
	return nil
}

// wrong is a refusal of index i in state now, wrapping err.
func wrong(err error, i int) func(now State) error {
	return func(now State) error { return fmt.Errorf("%w: %d is %s", err, i, now) }
}

// N returns the number of indices.
func (s *Allocator) N() int { return s.n }

// Acquire hands out a free index, or fails with ErrExhausted.
func (s *Allocator) Acquire() (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.free) == 0 {
		return 0, ErrExhausted
	}
	i := s.free[len(s.free)-1]
	s.set(i, Acquired)
	return i, nil
}

// Release returns an acquired index whose slot is completely gone. Releasing
// an index that is not acquired fails with ErrNotAcquired.
func (s *Allocator) Release(i int) error {
	return s.move(i, Acquired, Free, wrong(ErrNotAcquired, i))
}

// Quarantine marks an acquired index whose slot could not be fully removed:
// it is not handed out again until Free. Quarantining a free index claims it
// (the reconciler does this before touching a stray); an already
// quarantined index stays so.
func (s *Allocator) Quarantine(i int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.check(i); err != nil {
		return err
	}
	if s.state[i] != Quarantined {
		s.set(i, Quarantined)
	}
	return nil
}

// QuarantineIfFree quarantines i only if it is free, and reports whether it
// did. The reconciler uses it to claim an index before tearing down a stray,
// so that it never races with an Acquire.
func (s *Allocator) QuarantineIfFree(i int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.check(i) != nil || s.state[i] != Free {
		return false
	}
	s.set(i, Quarantined)
	return true
}

// Free returns a quarantined index to the free list once its slot is gone.
func (s *Allocator) Free(i int) error {
	return s.move(i, Quarantined, Free, wrong(ErrNotQuarantined, i))
}

// State returns the state of index i (Free for an index out of range is
// never returned: it is an error).
func (s *Allocator) State(i int) (State, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.check(i); err != nil {
		return 0, err
	}
	return s.state[i], nil
}

// Quarantined returns the quarantined indices in ascending order.
func (s *Allocator) Quarantined() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]int, 0, s.quar)
	for i := 1; i <= s.n; i++ {
		if s.state[i] == Quarantined {
			out = append(out, i)
		}
	}
	return out
}

// Counts is how many indices are in each state, read in O(1): for a
// caller that watches the allocator often (a health check, a metric) and
// needs no index's own state.
type Counts struct {
	Free, Acquired, Quarantined int
}

// Counts returns how many indices are in each state now.
func (s *Allocator) Counts() Counts {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Counts{Free: len(s.free), Acquired: s.acq, Quarantined: s.quar}
}

// Snapshot is a consistent copy of the allocator's state.
type Snapshot struct {
	// N is the number of indices.
	N int
	// Free, Acquired and Quarantined count the indices in each state.
	Free, Acquired, Quarantined int
	// States[i-1] is the state of index i.
	States []State
}

// Snapshot returns a consistent copy of every index's state, for an API that
// lists slots.
func (s *Allocator) Snapshot() Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Snapshot{
		N: s.n, Free: len(s.free), Acquired: s.acq, Quarantined: s.quar,
		States: slices.Clone(s.state[1:]),
	}
}

// Claim marks a free index acquired without handing it out through
// Acquire: for slots that exist already, such as leases restored and idle
// slots adopted at a restart. Claiming an index that is not free fails.
func (s *Allocator) Claim(i int) error {
	return s.move(i, Free, Acquired, func(now State) error { return fmt.Errorf("index: claim %d: it is %s", i, now) })
}

// Unquarantine marks a quarantined index acquired: its slot, kept as it
// was while quarantined (a slot held because something lives in it), is
// taken back as an operator adopts it. An index that is not quarantined
// fails with ErrNotQuarantined.
func (s *Allocator) Unquarantine(i int) error {
	return s.move(i, Quarantined, Acquired, wrong(ErrNotQuarantined, i))
}
