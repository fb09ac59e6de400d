package phases

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/phasegate/phasegate/network/leases"
)

func TestKeptAside(t *testing.T) {
	const (
		old     = StateFileName + ".corrupt-20261130T100000.000000000Z"
		newer   = StateFileName + ".corrupt-20261201T100000.000000000Z"
		journal = newer + leases.JournalSuffix
		orphan  = StateFileName + leases.JournalSuffix + ".orphan-20261201T110000.000000000Z"
	)
	for _, tc := range []struct {
		name  string
		files []string
		want  string
	}{
		{"nothing aside", []string{StateFileName, StateFileName + leases.JournalSuffix}, ""},
		{"the newest file moved aside", []string{old, newer}, newer},
		{"not its journal", []string{old, newer, journal}, newer},
		{"a journal whose file is gone", []string{StateFileName, orphan}, orphan},
		{"a file moved aside first", []string{old, orphan}, old},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for _, f := range tc.files {
				if err := os.WriteFile(filepath.Join(dir, f), []byte("x"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			got := keptAside(filepath.Join(dir, StateFileName))
			if want := tc.want; want != "" {
				tc.want = filepath.Join(dir, want)
			}
			if got != tc.want {
				t.Fatalf("keptAside = %q, want %q", got, tc.want)
			}
		})
	}
}
