package phases

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/phasegate/phasegate/app"
	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/network/pool"
	"github.com/phasegate/phasegate/network/reclaim"
	"github.com/phasegate/phasegate/network/reconcile"
	"github.com/phasegate/phasegate/network/slot"
	"github.com/phasegate/phasegate/network/storage"
	"github.com/phasegate/phasegate/phases/lockfile"
)

// Phase names, in the order of DESIGN.md section 3. Listen and serve are
// the App's own phases.
const (
	PhaseLock     = "lock"
	PhaseListen   = app.PhaseListen
	PhaseReclaim  = "reclaim"
	PhaseStorage  = "storage"
	PhasePopulate = "populate"
	PhaseRegister = "register"
	PhaseServe    = app.PhaseServe
)

// Daemon is the phasegate node daemon: an [app.App] running the phases
// and what they build. Create it with [New] and [Daemon.Run] it.
type Daemon struct {
	cfg Config
	log *slog.Logger
	app *app.App
	lc  *lifecycle.Lifecycle
	obs *observer // the daemon's own metrics

	// Built by the phases, each written once by its phase before any
	// dependent phase reads it: the lifecycle's ordering is the
	// synchronisation.
	lock   *lockfile.Lock
	mgr    *slot.Manager
	report *reclaim.Report
	store  *storage.Storage
	pool   *pool.Pool
	slots  *slotsService
}

// New validates cfg and declares the daemon's phases, its port and its
// API. Nothing on the host is created or changed until it runs.
func New(cfg Config) (*Daemon, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	d := &Daemon{cfg: cfg, log: log, obs: &observer{}}
	listenAfter := PhaseLock
	if cfg.SerialBaseline {
		listenAfter = PhasePopulate // the serial orchestrator's order: the port binds last
	}
	expected := cfg.Expected
	if expected == nil {
		expected = DefaultExpected()
	}
	a, err := app.New(app.Config{
		Name:              "phasegate",
		Version:           cfg.Version,
		Description:       "phasegate node daemon",
		Listen:            cfg.Listen,
		ListenAfter:       []string{listenAfter},
		TLS:               cfg.TLS,
		RequireClientCert: cfg.RequireClientCert,
		GRPCOptions:       d.obs.grpcOptions(),
		StartTimeout:      cfg.StartTimeout,
		DrainDelay:        cfg.DrainDelay,
		StopTimeout:       cfg.StopTimeout,
		Expected:          expected,
		Logger:            log,
		TracerProvider:    cfg.TracerProvider,
		UpgradeOnHangup:   cfg.UpgradeOnHangup,
		UpgradePreflight:  cfg.UpgradePreflight,
	}, d.graph()...)
	if err != nil {
		return nil, fmt.Errorf("phases: %w", err) // the config was validated: a bug in the graph
	}
	d.app, d.lc = a, a.Lifecycle()
	fail := func(err error) (*Daemon, error) {
		_ = a.Stop(context.Background()) // nothing started: releases the observers
		return nil, err
	}
	if err := d.obs.init(a.MeterProvider()); err != nil {
		return fail(err)
	}
	if err := a.Server().Declare(slotsServiceDesc()); err != nil {
		return fail(err)
	}
	return d, nil
}

// App returns the App that runs the daemon.
func (d *Daemon) App() *app.App { return d.app }

// Lifecycle returns the lifecycle that runs the phases.
func (d *Daemon) Lifecycle() *lifecycle.Lifecycle { return d.lc }

// Run runs the daemon until a signal or a failure; see [app.App.Run].
func (d *Daemon) Run(ctx context.Context) error {
	defer d.obs.close()
	return d.app.Run(ctx)
}

// quickPhase bounds a phase that does no real work on the host: only a
// bug or a wedged kernel call can make it take seconds.
const quickPhase = 30 * time.Second

// graph declares the daemon's phases; the App adds listen and serve. Every
// phase is bounded: the lock by --lock-wait, populate's attempts by
// --populate-timeout, reclaim by its budget (what is left is deferred, not
// failed), the others by quickPhase; and the whole start by
// --start-timeout.
func (d *Daemon) graph() []lifecycle.Phase {
	return []lifecycle.Phase{
		{Name: PhaseLock, Run: d.runLock, Stop: d.stopLock, Timeout: d.cfg.LockWait + quickPhase},
		{Name: PhaseReclaim, DependsOn: []string{PhaseLock}, Run: d.runReclaim, Stop: d.stopFirewall},
		{Name: PhaseStorage, DependsOn: []string{PhaseReclaim}, Run: d.runStorage, Timeout: quickPhase},
		{Name: PhasePopulate, DependsOn: []string{PhaseStorage}, Run: d.runPopulate, Stop: d.stopPool,
			Timeout: d.cfg.PopulateTimeout,
			// A fill that cannot make a single slot is worth a few tries:
			// the cause may be transient (a busy netlink socket, a slow
			// kernel worker).
			Retry: lifecycle.RetryPolicy{Attempts: 3, Backoff: time.Second, Jitter: 0.2}},
		{Name: PhaseRegister, DependsOn: []string{app.PhaseListen, PhasePopulate}, Run: d.runRegister, Timeout: quickPhase},
	}
}

// StopBudget is the longest the daemon's orderly stop can take with this
// configuration (see [app.App.StopBudget]); supervisors' kill timeouts must
// exceed it.
func (d *Daemon) StopBudget() time.Duration { return d.app.StopBudget() }

func (d *Daemon) runLock(ctx context.Context, p *lifecycle.Progress) error {
	if err := lockfile.EnsureDir(d.cfg.StateDir); err != nil {
		return lifecycle.Permanent(err)
	}
	path, err := d.cfg.LockPath()
	if err != nil {
		return lifecycle.Permanent(err)
	}
	if f := d.app.Inherited(lockHandover); f != nil {
		// An in-place upgrade: the old image kept the lock for us.
		l, err := lockfile.Adopt(f, path)
		if err != nil {
			return lifecycle.Permanent(fmt.Errorf("the lock handed over by the previous image: %w", err))
		}
		d.lock = l
		d.app.HandOver(lockHandover, l.File())
		p.SetMessage("kept across the upgrade")
		return nil
	}
	if d.cfg.LockWait > 0 {
		p.SetMessage("waiting up to " + d.cfg.LockWait.String() + " for " + path)
	}
	l, err := lockfile.Acquire(ctx, path, d.cfg.LockWait)
	if held := (*lockfile.HeldError)(nil); errors.As(err, &held) {
		return lifecycle.Permanent(d.cfg.HeldError(held))
	}
	if err != nil {
		return lifecycle.Permanent(err)
	}
	d.lock = l
	d.app.HandOver(lockHandover, l.File())
	return nil
}

// lockHandover names the lock's descriptor across an in-place upgrade.
const lockHandover = "lock"

// stopLock releases the lock, except for an upgrade: the new image takes
// the descriptor over, so no other daemon can slip in between.
func (d *Daemon) stopLock(context.Context) error {
	if d.app.Upgrading() {
		return nil
	}
	return d.lock.Unlock()
}

func (d *Daemon) runReclaim(ctx context.Context, p *lifecycle.Progress) error {
	if d.mgr == nil {
		mgr, err := slot.NewManager(ctx, d.cfg.Slots, slot.Options{})
		if err != nil {
			return err
		}
		d.mgr = mgr
	}
	p.SetTotal(0, "namespaces")
	opts := reclaim.Options{
		Strategy:    reclaim.Batched,
		Workers:     d.cfg.ReclaimWorkers,
		Budget:      d.cfg.ReclaimBudget,
		KillOrphans: d.cfg.ReclaimKillOrphans,
		Progress: func(done, total int) {
			if done == 0 || done == total || done%64 == 0 {
				p.SetTotal(int64(total), "namespaces")
			}
			p.SetDone(int64(done))
		},
	}
	if d.cfg.SerialBaseline {
		opts.Strategy = reclaim.Serial
	}
	rep, err := reclaim.Run(ctx, d.mgr, opts)
	if err != nil {
		return err
	}
	p.SetTotal(int64(rep.Found), "namespaces")
	p.SetDone(int64(len(rep.Reclaimed)))
	d.report = rep
	d.obs.reclaimed(rep)
	d.logReport(rep)
	return nil
}

// stopFirewall removes the daemon's nftables table once no slot is left in
// it, so a clean stop leaves nothing behind.
func (d *Daemon) stopFirewall(ctx context.Context) error {
	kept, err := DropEmptyFirewall(ctx, d.mgr)
	if kept > 0 {
		d.log.Warn("firewall table kept: slots still listed", "table", d.mgr.Firewall().Name(), "slots", kept)
	}
	return err
}

// DropEmptyFirewall deletes m's nftables table if its set lists no slot,
// and otherwise returns how many it lists: a table that still names slots
// (stuck ones) stays for the next reclaim.
func DropEmptyFirewall(ctx context.Context, m *slot.Manager) (kept int, err error) {
	fw := m.Firewall()
	names, err := fw.List(ctx)
	if err != nil {
		return 0, fmt.Errorf("list firewall set: %w", err)
	}
	if len(names) > 0 {
		return len(names), nil
	}
	return 0, fw.Delete(ctx)
}

func (d *Daemon) logReport(rep *reclaim.Report) {
	attrs := []any{
		"found", rep.Found, "reclaimed", len(rep.Reclaimed), "failed", len(rep.Failed),
		"deferred", len(rep.Deferred), "orphans", len(rep.Orphans), "cut_off", len(rep.CutOff),
		"duration", rep.Duration.Round(time.Millisecond).String(),
		// Where the time went: the scan of what exists, the /proc scan for
		// processes and holders, detach+unlink, the wait for the kernel to
		// drop the host links, the one nftables transaction.
		"scan", rep.Scan.Round(time.Millisecond).String(),
		"procs", rep.Timings.Procs.Round(time.Millisecond).String(),
		"unlink", rep.Timings.Unlink.Round(time.Millisecond).String(),
		"wait", rep.Timings.Wait.Round(time.Millisecond).String(),
		"firewall", rep.Timings.Firewall.Round(time.Millisecond).String(),
	}
	if rep.Duration > 0 && len(rep.Reclaimed) > 0 {
		attrs = append(attrs, "rate_per_s", int(float64(len(rep.Reclaimed))/rep.Duration.Seconds()))
	}
	d.log.Info("reclaim report", attrs...)
	for _, f := range rep.Failed {
		d.log.Warn("reclaim failed for a slot; quarantined for the reconciler", "slot", f.Index, "error", f.Err)
	}
	for _, o := range rep.Orphans {
		d.log.Warn("process inside a leaked namespace", "orphan", fmt.Sprintf("%+v", o))
	}
}

func (d *Daemon) runStorage(ctx context.Context, p *lifecycle.Progress) error {
	store, err := storage.New(d.cfg.Slots.Slots, d.report.Quarantine())
	if err != nil {
		return lifecycle.Permanent(err)
	}
	d.store = store
	if q := store.Quarantined(); len(q) > 0 {
		p.SetMessage(fmt.Sprintf("%d slots quarantined for the reconciler", len(q)))
	}
	rec := reconcile.New(d.mgr, store, reconcile.Options{
		Interval: d.cfg.ReconcileInterval,
		Teardown: slot.TeardownOptions{Workers: d.cfg.ReclaimWorkers, KillOrphans: d.cfg.ReclaimKillOrphans},
		OnPass: func(pass reconcile.Pass) {
			d.log.Debug("reconcile pass", "pass", fmt.Sprintf("%+v", pass))
		},
	})
	p.Defer("reconcile", func(ctx context.Context, _ *lifecycle.Progress) error {
		err := rec.Run(ctx)
		if ctx.Err() != nil {
			return ctx.Err() // stopped by the drain: not a fault
		}
		return err
	})
	return nil
}

func (d *Daemon) runPopulate(ctx context.Context, p *lifecycle.Progress) error {
	if d.pool == nil {
		pl, err := pool.New(d.mgr, d.store, pool.Options{
			Target:   d.cfg.PoolSize,
			Grace:    d.cfg.PoolGrace,
			Teardown: slot.TeardownOptions{Workers: d.cfg.ReclaimWorkers, KillOrphans: d.cfg.ReclaimKillOrphans},
		})
		if err != nil {
			return lifecycle.Permanent(err)
		}
		d.pool = pl
		d.obs.setPool(pl)
		d.slots = newSlotsService(d.cfg.Slots, d.store, pl, d.log)
	}
	p.SetTotal(int64(d.cfg.PoolMinReady), "warm slots")
	stopWatch := watchPool(d.pool, p)
	err := d.pool.WaitReady(ctx, d.cfg.PoolMinReady)
	stopWatch()
	if err != nil {
		return fmt.Errorf("wait for %d warm slots: %w (last pool error: %v)", d.cfg.PoolMinReady, err, d.pool.Snapshot().LastError)
	}
	p.SetDone(int64(d.cfg.PoolMinReady))
	if d.cfg.PoolSize > d.cfg.PoolMinReady {
		p.Defer("fill", func(ctx context.Context, tp *lifecycle.Progress) error {
			tp.SetTotal(int64(d.cfg.PoolSize), "warm slots")
			stop := watchPool(d.pool, tp)
			defer stop()
			if err := d.pool.WaitReady(ctx, d.cfg.PoolSize); err != nil {
				return err
			}
			tp.SetDone(int64(d.cfg.PoolSize))
			return nil
		})
	}
	return nil
}

// watchPool reports the pool's warm count into p until stopped.
func watchPool(pl *pool.Pool, p *lifecycle.Progress) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			p.SetDone(int64(len(pl.Snapshot().Idle)))
			select {
			case <-t.C:
			case <-done:
				return
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

// stopPool destroys every slot this run made: the idle and half-made ones
// through Close, then those still acquired, which Put destroys once the
// pool is closed.
func (d *Daemon) stopPool(ctx context.Context) error {
	err := d.pool.Close(ctx)
	for _, s := range d.slots.takeAll() {
		err = errors.Join(err, d.pool.Put(ctx, s))
	}
	return err
}

func (d *Daemon) runRegister(context.Context, *lifecycle.Progress) error {
	srv := d.app.Server()
	if err := srv.Bind(slotsServiceName, d.slots); err != nil {
		return lifecycle.Permanent(err)
	}
	if err := srv.Handle("GET /debug/slots", d.slots.debugHandler()); err != nil {
		return lifecycle.Permanent(err)
	}
	return nil
}
