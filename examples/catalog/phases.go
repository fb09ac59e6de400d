package main

import (
	"context"
	"errors"

	"github.com/phasegate/phasegate/examples/catalog/catalogdb"
	"github.com/phasegate/phasegate/examples/catalog/catalogv1"
	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/server"
)

// catalog is what the phases build and hand each other. Each field is set
// by one phase and read only by the phases that depend on it, which the
// lifecycle runs strictly after.
type catalog struct {
	configFile string
	srv        *server.Server

	cfg   catalogdb.Config
	store *catalogdb.Store
	cache *catalogdb.Cache
}

// loadConfig reads and checks the configuration. A bad one will not get
// better by retrying: the error is permanent.
func (c *catalog) loadConfig(context.Context, *lifecycle.Progress) (err error) {
	c.cfg, err = catalogdb.LoadConfig(c.configFile)
	return lifecycle.Permanent(err)
}

// migrate opens the store, waiting for its lock while another process
// holds it, and brings its schema to the latest version, one migration at
// a time: health shows "phase migrate 7/20 migrations: price as integer
// cents".
func (c *catalog) migrate(ctx context.Context, p *lifecycle.Progress) error {
	s, err := catalogdb.Open(ctx, c.cfg, func() {
		p.SetMessage("waiting for the lock on " + c.cfg.DB + ", held by another process")
	})
	if err != nil {
		return err
	}
	p.SetMessage("")
	err = s.Migrate(ctx, func(done, total int, name string) {
		p.SetTotal(int64(total), "migrations")
		p.SetDone(int64(done))
		p.SetMessage(name)
	})
	if err != nil {
		// A failed phase is not stopped: close what it opened, so that
		// nothing holds the lock.
		return errors.Join(err, s.Close())
	}
	c.store = s
	return nil
}

func (c *catalog) closeStore(context.Context) error { return c.store.Close() }

// warm loads every product into memory: "phase warm 420/1000 products".
func (c *catalog) warm(ctx context.Context, p *lifecycle.Progress) (err error) {
	c.cache, err = catalogdb.Warm(ctx, c.store, func(done, total int) {
		if done == 1 {
			p.SetTotal(int64(total), "products")
		}
		p.SetDone(int64(done))
	})
	return err
}

// register binds the service and the route declared before the port
// opened; they answer once the catalog serves, that is when this phase
// has succeeded.
func (c *catalog) register(context.Context, *lifecycle.Progress) error {
	s := catalogdb.NewServer(c.cache)
	return errors.Join(c.srv.Bind(catalogv1.ServiceName, s), c.srv.BindHTTP(catalogdb.RouteProduct, s))
}
