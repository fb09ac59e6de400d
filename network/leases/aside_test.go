package leases

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// TestKeptAside: what MoveAside and Open set aside is listed by kind,
// oldest first, and nothing else beside the store is.
func TestKeptAside(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "leases.db")
	names := []string{
		"leases.db", "leases.db" + JournalSuffix, "leases.db.schema3.bak", "other.db.corrupt-20261130T100000.000000000Z",
		"leases.db.corrupt-20261201T100000.000000000Z", "leases.db.corrupt-20261130T100000.000000000Z",
		"leases.db.corrupt-20261201T100000.000000000Z" + JournalSuffix,
		"leases.db" + JournalSuffix + ".orphan-20261202T100000.000000000Z",
	}
	for _, n := range names {
		if err := os.WriteFile(filepath.Join(dir, n), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	k := KeptAside(path)
	in := func(ns ...string) string {
		for i := range ns {
			ns[i] = filepath.Join(dir, ns[i])
		}
		return fmt.Sprint(ns)
	}
	for _, c := range []struct{ what, got, want string }{
		{"copies", fmt.Sprint(k.Copies), in("leases.db.corrupt-20261130T100000.000000000Z", "leases.db.corrupt-20261201T100000.000000000Z")},
		{"their journals", fmt.Sprint(k.CopyJournals), in("leases.db.corrupt-20261201T100000.000000000Z" + JournalSuffix)},
		{"orphans", fmt.Sprint(k.Orphans), in("leases.db" + JournalSuffix + ".orphan-20261202T100000.000000000Z")},
		{"all", fmt.Sprint(k.All()), in("leases.db.corrupt-20261130T100000.000000000Z", "leases.db.corrupt-20261201T100000.000000000Z",
			"leases.db.corrupt-20261201T100000.000000000Z"+JournalSuffix, "leases.db"+JournalSuffix+".orphan-20261202T100000.000000000Z")},
	} {
		if c.got != c.want {
			t.Errorf("%s: %s, want %s", c.what, c.got, c.want)
		}
	}
	if k := KeptAside(filepath.Join(t.TempDir(), "leases.db")); len(k.All()) != 0 {
		t.Errorf("an empty directory: %+v", k)
	}
}
