package catalogdb

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"
)

func open(t *testing.T, cfg Config) *Store {
	t.Helper()
	s, err := Open(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// A migration stopped half-way resumes at the next start from the
// version it reached, each step applied once.
func TestMigrateResumes(t *testing.T) {
	cfg := Config{DB: filepath.Join(t.TempDir(), "c.db"), Products: 50}
	s := open(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	err := s.Migrate(ctx, func(done, _ int, _ string) {
		if done == 7 {
			cancel()
		}
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Migrate = %v, want it stopped by its context", err)
	}
	if v, _ := s.Version(); v != 7 {
		t.Fatalf("version %d after stopping at 7", v)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = open(t, cfg)
	defer s.Close()
	var reports [][2]int
	if err := s.Migrate(context.Background(), func(done, total int, _ string) { reports = append(reports, [2]int{done, total}) }); err != nil {
		t.Fatal(err)
	}
	if len(reports) != Migrations()-7+1 || reports[0] != [2]int{7, Migrations()} || reports[len(reports)-1] != [2]int{Migrations(), Migrations()} {
		t.Fatalf("reports %v, want 7/%d, then each step to %d", reports, Migrations(), Migrations())
	}
	c, err := Warm(context.Background(), s, func(int, int) {})
	if err != nil {
		t.Fatal(err)
	}
	if c.Len() != 50 {
		t.Fatalf("warmed %d products, want 50", c.Len())
	}
	p := c.products[SKU(42)].AsMap()
	if p["title"] != "Product 42" || p["price_cents"] != 4242.0 || p["category"] != "kitchen" || p["name"] != nil || p["cat"] != nil {
		t.Fatalf("product 42 after the migrations: %v", p)
	}
}

// A store written by a newer program is refused, not mangled.
func TestMigrateRefusesANewerSchema(t *testing.T) {
	cfg := Config{DB: filepath.Join(t.TempDir(), "c.db")}
	s := open(t, cfg)
	defer s.Close()
	if err := s.db.Update(func(tx *bolt.Tx) error { return setVersion(tx, Migrations()+1) }); err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(context.Background(), func(int, int, string) {}); !errors.Is(err, ErrNewerSchema) {
		t.Fatalf("Migrate = %v, want ErrNewerSchema", err)
	}
}

// Open waits while another holder has the file, saying so, and gives up
// when its context ends.
func TestOpenWaitsForTheLock(t *testing.T) {
	cfg := Config{DB: filepath.Join(t.TempDir(), "c.db")}
	holder := open(t, cfg)
	defer holder.Close()
	ctx, cancel := context.WithCancel(context.Background())
	waits := 0
	_, err := Open(ctx, cfg, func() {
		if waits++; waits == 2 {
			cancel()
		}
	})
	if !errors.Is(err, context.Canceled) || waits != 2 {
		t.Fatalf("Open = %v after %d waits, want it cancelled after 2", err, waits)
	}
}

func TestLoadConfig(t *testing.T) {
	for _, tc := range []struct{ name, body, err string }{
		{"unknown field", `{"db":"x","prodcts":1}`, `unknown field "prodcts"`},
		{"no db", `{"db":""}`, "db is required"},
		{"negative", `{"db":"x","products":-1}`, "products is -1"},
	} {
		path := filepath.Join(t.TempDir(), "c.json")
		if err := os.WriteFile(path, []byte(tc.body), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadConfig(path); err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%s: LoadConfig = %v, want an error saying %q", tc.name, err, tc.err)
		}
	}
	if c, err := LoadConfig(""); err != nil || c != DefaultConfig() {
		t.Errorf("LoadConfig(\"\") = %v, %v; want the defaults", c, err)
	}
}
