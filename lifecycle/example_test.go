package lifecycle_test

import (
	"context"
	"fmt"

	"github.com/phasegate/phasegate/lifecycle"
)

// The daemon's startup graph from DESIGN.md section 3, with no-op bodies:
// listen and reclaim both wait only for lock, so the port never waits for
// host clean-up.
func Example() {
	noop := func(context.Context, *lifecycle.Progress) error { return nil }
	lc, err := lifecycle.New([]lifecycle.Phase{
		{Name: "lock", Run: noop},
		{Name: "listen", DependsOn: []string{"lock"}, Run: noop},
		{Name: "reclaim", DependsOn: []string{"lock"}, Run: func(ctx context.Context, p *lifecycle.Progress) error {
			p.SetTotal(3, "namespaces")
			for range 3 {
				p.Add(1)
			}
			return nil
		}},
		{Name: "storage", DependsOn: []string{"reclaim"}, Run: noop},
		{Name: "populate", DependsOn: []string{"storage"}, Run: noop},
		{Name: "register", DependsOn: []string{"listen", "populate"}, Run: noop},
		{Name: "serve", DependsOn: []string{"register"}, Run: noop},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := lc.Start(context.Background()); err != nil {
		fmt.Println(err)
		return
	}
	s := lc.Snapshot()
	fmt.Println(s.State)
	for _, p := range s.Phases {
		if p.Progress.IsZero() {
			fmt.Printf("%-8s %s\n", p.Name, p.State)
		} else {
			fmt.Printf("%-8s %s %s\n", p.Name, p.State, p.Progress)
		}
	}
	fmt.Println(lc.Drain(context.Background()), lc.State())
	// Output:
	// serving
	// lock     succeeded
	// listen   succeeded
	// reclaim  succeeded 3/3 namespaces
	// storage  succeeded
	// populate succeeded
	// register succeeded
	// serve    succeeded
	// <nil> stopped
}

// New reports every problem of a declaration at once.
func ExampleNew() {
	noop := func(context.Context, *lifecycle.Progress) error { return nil }
	_, err := lifecycle.New([]lifecycle.Phase{
		{Name: "reclaim", DependsOn: []string{"storage"}, Run: noop},
		{Name: "storage", DependsOn: []string{"reclaim"}, Run: noop},
		{Name: "populate", DependsOn: []string{"populate", "network"}, Run: noop},
	})
	fmt.Println(err)
	// Output:
	// phase "populate" depends on itself
	// phase "populate" depends on unknown phase "network"
	// dependency cycle: reclaim -> storage -> reclaim
}
