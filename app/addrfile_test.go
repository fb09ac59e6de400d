package app

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/phasegate/phasegate/lifecycle"
)

// With AddrFileEnv set, the bound address is in the file before serve,
// whole, in any log format; a file that cannot be written fails listen,
// and so the start.
func TestAddrFile(t *testing.T) {
	tests := []struct {
		name    string
		file    func(dir string) string
		wantErr bool
	}{
		{name: "written", file: func(dir string) string { return filepath.Join(dir, "addr") }},
		{name: "unwritable", file: func(dir string) string { return filepath.Join(dir, "missing", "addr") }, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := tt.file(t.TempDir())
			t.Setenv(AddrFileEnv, path)
			var seen string // the file as serve's dependency found it
			a, err := New(testConfig(), lifecycle.Phase{Name: "ready", DependsOn: []string{PhaseListen}, Run: func(context.Context, *lifecycle.Progress) error {
				b, err := os.ReadFile(path)
				seen = string(b)
				return err
			}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = a.Stop(context.Background()) })
			err = a.Start(context.Background())
			if tt.wantErr {
				var pe *lifecycle.PhaseError
				if !errors.As(err, &pe) || pe.Phase != PhaseListen {
					t.Fatalf("Start = %v, want listen's failure", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if want := a.Addr(context.Background()).String() + "\n"; seen != want {
				t.Fatalf("the address file held %q before serve, want %q", seen, want)
			}
		})
	}
}
