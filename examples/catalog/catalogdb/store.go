package catalogdb

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// lockPoll is how long one attempt to take the store's file lock waits.
// Between attempts Open reports that it waits and checks its context:
// bbolt's own wait cannot be cancelled.
const lockPoll = 200 * time.Millisecond

// Store is the catalog's bbolt database.
type Store struct {
	db  *bolt.DB
	cfg Config
}

// Open opens the store named by cfg, creating it if need be. bbolt holds
// an exclusive lock on the file while it is open, so a second catalog on
// the same file waits here: Open calls waiting (when not nil) each time
// the lock was still held, and returns ctx's cause once ctx ends.
func Open(ctx context.Context, cfg Config, waiting func()) (*Store, error) {
	for {
		db, err := bolt.Open(cfg.DB, 0o600, &bolt.Options{Timeout: lockPoll})
		switch {
		case err == nil:
			return &Store{db: db, cfg: cfg}, nil
		case !errors.Is(err, berrors.ErrTimeout):
			return nil, fmt.Errorf("open %s: %w", cfg.DB, err)
		case waiting != nil:
			waiting()
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("open %s: still locked by another process: %w", cfg.DB, context.Cause(ctx))
		}
	}
}

// Close closes the store; it waits for read transactions still open.
func (s *Store) Close() error { return s.db.Close() }

// Path is the store's file.
func (s *Store) Path() string { return s.db.Path() }

var (
	bucketSchema   = []byte("schema")
	bucketProducts = []byte("products")
	keyVersion     = []byte("version")
)

// Version returns the schema version the store is at: the number of
// migrations applied.
func (s *Store) Version() (int, error) {
	var v int
	err := s.db.View(func(tx *bolt.Tx) error {
		v = version(tx)
		return nil
	})
	return v, err
}

func version(tx *bolt.Tx) int {
	b := tx.Bucket(bucketSchema)
	if b == nil {
		return 0
	}
	raw := b.Get(keyVersion)
	if len(raw) != 8 {
		return 0
	}
	return int(binary.BigEndian.Uint64(raw))
}

func setVersion(tx *bolt.Tx, v int) error {
	b, err := tx.CreateBucketIfNotExists(bucketSchema)
	if err != nil {
		return err
	}
	return b.Put(keyVersion, binary.BigEndian.AppendUint64(nil, uint64(v)))
}

// ErrNewerSchema is returned by Migrate for a store written by a newer
// catalog: this one cannot know what its schema means.
var ErrNewerSchema = errors.New("the store's schema is newer than this program knows")

// Migrate brings the store's schema to the latest version, one migration
// per transaction, so that a migration interrupted by a crash or a stop
// resumes where it left off at the next start. It calls report with the
// version reached and the latest version before the first migration and
// after each one, and traces each migration as a span under ctx's (the
// phase's). A ctx that ends stops it between two migrations.
func (s *Store) Migrate(ctx context.Context, report func(done, total int, name string)) error {
	current, err := s.Version()
	if err != nil {
		return err
	}
	total := len(migrations)
	if current > total {
		return fmt.Errorf("migrate %s: at version %d, latest known %d: %w", s.Path(), current, total, ErrNewerSchema)
	}
	report(current, total, "")
	tracer := trace.SpanFromContext(ctx).TracerProvider().Tracer("github.com/phasegate/phasegate/examples/catalog/catalogdb")
	for v := current + 1; v <= total; v++ {
		if err := context.Cause(ctx); err != nil {
			return fmt.Errorf("migrate: stopped at version %d: %w", v-1, err)
		}
		m := migrations[v-1]
		_, span := tracer.Start(ctx, fmt.Sprintf("migration %02d %s", v, m.name),
			trace.WithAttributes(attribute.Int("catalog.schema.version", v)))
		err := s.db.Update(func(tx *bolt.Tx) error {
			if err := m.up(tx, s.cfg); err != nil {
				return err
			}
			return setVersion(tx, v)
		})
		if err != nil {
			span.RecordError(err)
		}
		span.End()
		if err != nil {
			return fmt.Errorf("migration %d (%s): %w", v, m.name, err)
		}
		report(v, total, m.name)
	}
	return nil
}

// Migrations returns the number of migrations this program knows: the
// latest schema version.
func Migrations() int { return len(migrations) }

// Products calls fn with each product's SKU and record, in SKU order, in
// one read transaction. total is how many there are.
func (s *Store) Products(fn func(total int, sku string, record []byte) error) error {
	return s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketProducts)
		if b == nil {
			return errors.New("no products bucket: the store is not migrated")
		}
		total := b.Stats().KeyN
		return b.ForEach(func(k, v []byte) error { return fn(total, string(k), v) })
	})
}
