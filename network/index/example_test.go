package index_test

import (
	"errors"
	"fmt"

	"github.com/phasegate/phasegate/network/index"
)

// The allocator is built after reclaim: indices whose namespace could not
// be removed yet start quarantined and are never handed out until the
// reconciler frees them.
func Example() {
	s, err := index.New(4, []int{2}) // reclaim left slot 2 behind
	if err != nil {
		fmt.Println(err)
		return
	}
	a, _ := s.Acquire()
	b, _ := s.Acquire()
	c, _ := s.Acquire()
	_, err = s.Acquire()
	fmt.Println(a, b, c, errors.Is(err, index.ErrExhausted))

	// The reconciler finished slot 2: it can be handed out again.
	if err := s.Free(2); err != nil {
		fmt.Println(err)
	}
	// A slot handed back whose teardown failed goes to quarantine.
	if err := s.Quarantine(b); err != nil {
		fmt.Println(err)
	}
	snap := s.Snapshot()
	fmt.Println(snap.Free, snap.Acquired, snap.Quarantined, snap.States)
	fmt.Println(s.Release(b))
	// Output:
	// 1 3 4 true
	// 1 2 1 [acquired free quarantined acquired]
	// index: not acquired: 3 is quarantined
}
