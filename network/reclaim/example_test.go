package reclaim_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/phasegate/phasegate/network/reclaim"
	"github.com/phasegate/phasegate/network/slot"
)

// Reclaim what an earlier run leaked, within a budget: what the budget
// did not reach is deferred, and the report says which indices the
// allocator must quarantine until the reconciler finishes them. It needs
// root, so it is compiled but not run by go test.
func ExampleRun() {
	ctx := context.Background()
	m, err := slot.NewManager(ctx, slot.DefaultConfig(), slot.DefaultOptions())
	if err != nil {
		log.Fatal(err)
	}
	rep, err := reclaim.Run(ctx, m, reclaim.Options{
		Budget:   10 * time.Second,
		Progress: func(done, total int) { log.Printf("reclaim %d/%d namespaces", done, total) },
	})
	if err != nil {
		log.Print(err) // the report is valid all the same
	}
	log.Print(rep)
	fmt.Println(rep.Quarantine())
}

// The indices to quarantine are the deferred, the failed and the
// unreadable ones within the configured slots, once each, ascending;
// those beyond (left by a run with more slots) are the reconciler's.
func ExampleReport_Quarantine() {
	rep := &reclaim.Report{
		Slots:     8,
		Reclaimed: []int{1, 2, 3},
		Deferred:  []int{7, 5, 12},
		Failed:    []slot.Failure{{Index: 4, Err: errors.New("host veth still present")}, {Index: 5}},
	}
	fmt.Println(rep.Quarantine())
	// Output:
	// [4 5 7]
}
