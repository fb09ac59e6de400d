package lifecycle_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/phasegate/phasegate/lifecycle"
)

// FuzzNew declares graphs from arbitrary text — one phase per line,
// "name: dep dep" — and checks that New either accepts a graph that then
// runs to serving in dependency order, or rejects it with only the typed
// error it documents.
func FuzzNew(f *testing.F) {
	f.Add("lock:\nlisten: lock\nreclaim: lock\nstorage: reclaim\npopulate: storage\nregister: listen populate\nserve: register")
	f.Add("reclaim: storage\nstorage: reclaim")
	f.Add("a: a")
	f.Add(":\n: x")
	f.Add("a: b\nb: c\nc: a\nd: d e")
	f.Add("a\na")
	f.Fuzz(func(t *testing.T, decl string) {
		var phases []lifecycle.Phase
		var order []string
		for _, line := range strings.Split(decl, "\n") {
			if len(phases) > 32 {
				break
			}
			name, deps, _ := strings.Cut(line, ":")
			p := lifecycle.Phase{Name: strings.TrimSpace(name), DependsOn: strings.Fields(deps)}
			p.Run = func(context.Context, *lifecycle.Progress) error {
				order = append(order, p.Name) // runs one at a time: WithMaxParallel(1)
				return nil
			}
			phases = append(phases, p)
		}
		lc, err := lifecycle.New(phases, lifecycle.WithMaxParallel(1))
		if err != nil {
			for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
				if _, ok := errors.AsType[*lifecycle.DeclarationError](e); !ok {
					t.Fatalf("untyped validation error %T: %v", e, e)
				}
			}
			return
		}
		if err := lc.Start(context.Background()); err != nil {
			t.Fatalf("valid graph failed to start: %v", err)
		}
		pos := map[string]int{}
		for i, n := range order {
			pos[n] = i
		}
		for _, p := range phases {
			for _, d := range p.DependsOn {
				if pos[p.Name] < pos[d] {
					t.Fatalf("%s ran before its dependency %s", p.Name, d)
				}
			}
		}
	})
}
