package lifecycle_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/phasegate/phasegate/lifecycle"
)

func nop(context.Context, *lifecycle.Progress) error { return nil }

func TestNewReportsEachProblem(t *testing.T) {
	tests := []struct {
		name   string
		phases []lifecycle.Phase
		phase  string // the DeclarationError's Phase
		msg    string
	}{
		{"empty name", []lifecycle.Phase{{Name: "lock", Run: nop}, {Name: "", Run: nop}}, "", "phase #1 has an empty name"},
		{"duplicate", []lifecycle.Phase{{Name: "lock", Run: nop}, {Name: "lock", Run: nop}}, "lock", `phase "lock" is declared more than once`},
		{"unknown dependency", []lifecycle.Phase{{Name: "listen", DependsOn: []string{"lokc"}, Run: nop}}, "listen", `phase "listen" depends on unknown phase "lokc"`},
		{"self dependency", []lifecycle.Phase{{Name: "serve", DependsOn: []string{"serve"}, Run: nop}}, "serve", `phase "serve" depends on itself`},
		{"two-phase cycle", []lifecycle.Phase{
			{Name: "reclaim", DependsOn: []string{"storage"}, Run: nop},
			{Name: "storage", DependsOn: []string{"reclaim"}, Run: nop},
		}, "reclaim", "dependency cycle: reclaim -> storage -> reclaim"},
		{"long cycle found from its middle", []lifecycle.Phase{
			{Name: "lock", Run: nop},
			{Name: "populate", DependsOn: []string{"lock", "reclaim"}, Run: nop},
			{Name: "reclaim", DependsOn: []string{"storage"}, Run: nop},
			{Name: "storage", DependsOn: []string{"populate"}, Run: nop},
		}, "populate", "dependency cycle: populate -> reclaim -> storage -> populate"},
		{"missing run", []lifecycle.Phase{{Name: "lock"}}, "lock", `phase "lock": Run is nil`},
		{"negative timeout", []lifecycle.Phase{{Name: "lock", Run: nop, Timeout: -1}}, "lock", `phase "lock": negative Timeout`},
		{"repeated dependency", []lifecycle.Phase{{Name: "lock", Run: nop}, {Name: "listen", DependsOn: []string{"lock", "lock"}, Run: nop}}, "listen", `phase "listen": depends on lock twice`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			lc, err := lifecycle.New(tc.phases)
			if err == nil || lc != nil {
				t.Fatalf("New = %v, %v; want an error", lc, err)
			}
			if e, ok := errors.AsType[*lifecycle.DeclarationError](err); !ok || e.Phase != tc.phase {
				t.Errorf("error %v (%T) is not a *DeclarationError of phase %q", err, err, tc.phase)
			}
			if err.Error() != tc.msg {
				t.Errorf("message = %q, want %q", err.Error(), tc.msg)
			}
		})
	}
}

func TestNewReportsEveryProblemAtOnce(t *testing.T) {
	_, err := lifecycle.New([]lifecycle.Phase{
		{Name: "", Run: nop},
		{Name: "a", DependsOn: []string{"b", "ghost"}, Run: nop},
		{Name: "b", DependsOn: []string{"a"}, Run: nop},
		{Name: "b", Run: nop},
		{Name: "c", DependsOn: []string{"c"}},
	})
	if err == nil {
		t.Fatal("no error")
	}
	want := []string{
		"phase #0 has an empty name",
		`phase "b" is declared more than once`,
		`phase "a" depends on unknown phase "ghost"`,
		`phase "c": Run is nil`,
		`phase "c" depends on itself`,
		"dependency cycle: a -> b -> a",
	}
	got := strings.Split(err.Error(), "\n")
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("errors:\n%s\nwant:\n%s", err, strings.Join(want, "\n"))
	}
	if u, ok := err.(interface{ Unwrap() []error }); !ok || len(u.Unwrap()) != len(want) {
		t.Fatalf("error is not a join of %d errors: %#v", len(want), err)
	}
}

func TestNewAcceptsADiamond(t *testing.T) {
	_, err := lifecycle.New([]lifecycle.Phase{
		{Name: "a", Run: nop},
		{Name: "b", DependsOn: []string{"a"}, Run: nop},
		{Name: "c", DependsOn: []string{"a"}, Run: nop},
		{Name: "d", DependsOn: []string{"b", "c"}, Run: nop},
	})
	if err != nil {
		t.Fatal(err)
	}
}
