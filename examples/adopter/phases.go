package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/phasegate/phasegate/app"
	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/server"
)

// flags are the command line's values as given; the config phase checks
// them and makes the configuration of them.
type flags struct {
	listen, drainDelay, db, upstream, entries string
}

// config is the service's configuration, made by the config phase.
type config struct {
	port     app.Port
	db       string
	upstream *url.URL
	entries  int
}

// service is what the phases build and hand each other: each field is set
// by one phase and read only by the phases that depend on it.
type service struct {
	flags flags
	srv   *server.Server

	cfg   config
	db    *bolt.DB
	cache map[string]string
}

// config checks the flags' values. A bad value does not get better by
// retrying, nor by restarting: the error is a configuration error
// (app.BadConfig), so the phase is not retried and the process exits 2 at
// once, which tells a supervisor to stop restarting it.
func (s *service) config(context.Context, *lifecycle.Progress) error {
	n, err := strconv.Atoi(s.flags.entries)
	if err != nil || n <= 0 {
		return app.BadConfig(fmt.Errorf("-cache-entries %q: want a positive number", s.flags.entries))
	}
	u, err := url.Parse(s.flags.upstream)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return app.BadConfig(fmt.Errorf("-upstream %q: want an http or https URL", s.flags.upstream))
	}
	drain, err := time.ParseDuration(s.flags.drainDelay)
	if err != nil || drain < 0 {
		return app.BadConfig(fmt.Errorf("-drain-delay %q: want a duration of 0s or more", s.flags.drainDelay))
	}
	if _, _, err := net.SplitHostPort(s.flags.listen); err != nil {
		return app.BadConfig(fmt.Errorf("-listen %q: want host:port: %w", s.flags.listen, err))
	}
	s.cfg = config{port: app.Port{Listen: s.flags.listen, DrainDelay: drain}, db: s.flags.db, upstream: u, entries: n}
	return nil
}

// port is the App's PortFrom: the address and drain delay the config
// phase read, so that every flag is read in one place.
func (s *service) port() (app.Port, error) { return s.cfg.port, nil }

var (
	bucketItems = []byte("items")
	bucketMeta  = []byte("meta")
	keyVersion  = []byte("version")
	keyCount    = []byte("count")
)

// migrations bring the store's schema to the latest version, one step at
// a time; the store records the last one applied.
var migrations = []struct {
	name string
	run  func(tx *bolt.Tx, cfg config) error
}{
	{"create items", func(tx *bolt.Tx, _ config) error {
		_, err := tx.CreateBucketIfNotExists(bucketItems)
		return err
	}},
	{"seed items", func(tx *bolt.Tx, cfg config) error {
		b := tx.Bucket(bucketItems)
		for i := range cfg.entries {
			if err := b.Put([]byte(itemKey(i)), []byte("value "+strconv.Itoa(i))); err != nil {
				return err
			}
		}
		return nil
	}},
	{"count items", func(tx *bolt.Tx, _ config) error {
		n := tx.Bucket(bucketItems).Stats().KeyN
		return tx.Bucket(bucketMeta).Put(keyCount, binary.BigEndian.AppendUint64(nil, uint64(n)))
	}},
}

// itemKey is the key of the i-th item.
func itemKey(i int) string { return fmt.Sprintf("item-%05d", i) }

// openDB opens the store and applies the migrations it lacks:
// "phase db 2/3 migrations: seed items".
func (s *service) openDB(ctx context.Context, p *lifecycle.Progress) error {
	db, err := bolt.Open(s.cfg.db, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		return fmt.Errorf("open %s: %w", s.cfg.db, err)
	}
	p.SetTotal(int64(len(migrations)), "migrations")
	if err := migrate(ctx, db, s.cfg, p); err != nil {
		return errors.Join(err, db.Close()) // a failed phase is not stopped
	}
	s.db = db
	return nil
}

func migrate(ctx context.Context, db *bolt.DB, cfg config, p *lifecycle.Progress) error {
	for i, m := range migrations {
		if err := ctx.Err(); err != nil {
			return err
		}
		p.SetMessage(m.name)
		err := db.Update(func(tx *bolt.Tx) error {
			meta, err := tx.CreateBucketIfNotExists(bucketMeta)
			if err != nil {
				return err
			}
			if v := meta.Get(keyVersion); v != nil && binary.BigEndian.Uint64(v) > uint64(i) {
				return nil // applied before
			}
			if err := m.run(tx, cfg); err != nil {
				return err
			}
			return meta.Put(keyVersion, binary.BigEndian.AppendUint64(nil, uint64(i+1)))
		})
		if err != nil {
			return fmt.Errorf("migration %d (%s): %w", i+1, m.name, err)
		}
		p.SetDone(int64(i + 1))
	}
	p.SetMessage("")
	return nil
}

func (s *service) closeDB(context.Context) error { return s.db.Close() }

// fillCache loads every item into memory: "phase cache 4200/10000 entries".
func (s *service) fillCache(ctx context.Context, p *lifecycle.Progress) error {
	cache := make(map[string]string, s.cfg.entries)
	p.SetTotal(int64(s.cfg.entries), "entries")
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketItems).ForEach(func(k, v []byte) error {
			cache[string(k)] = string(v)
			if len(cache)%1000 == 0 {
				p.SetDone(int64(len(cache)))
				return ctx.Err()
			}
			return nil
		})
	})
	if err != nil {
		return err
	}
	p.SetDone(int64(len(cache)))
	s.cache = cache
	return nil
}

// checkUpstream asks the upstream's /ping once; the phase's retry policy
// asks again, with backoff, until it answers 200. Health says so meanwhile:
// "phase upstream attempt 4: GET …/ping: 503 Service Unavailable".
func (s *service) checkUpstream(ctx context.Context, _ *lifecycle.Progress) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.cfg.upstream.JoinPath("ping").String(), nil)
	if err != nil {
		return lifecycle.Permanent(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", req.URL, resp.Status)
	}
	return nil
}

// bind binds the gRPC service and the HTTP route declared before the port
// opened; they answer once the service serves, that is once this phase
// has succeeded.
func (s *service) bind(context.Context, *lifecycle.Progress) error {
	items := &items{cache: s.cache}
	// By its ServiceDesc, not its name: a service generated by protoc
	// binds with its Register function, itemsv1.RegisterItemsServer(b,
	// items), which also checks items' type at compile time.
	b := s.srv.Binder()
	b.RegisterService(&itemsDesc, items)
	return errors.Join(b.Err(), s.srv.BindHTTP(routeItem, items))
}
