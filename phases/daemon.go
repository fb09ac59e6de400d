package phases

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"google.golang.org/grpc"

	"github.com/phasegate/phasegate/app"
	"github.com/phasegate/phasegate/control"
	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/network/egress"
	"github.com/phasegate/phasegate/network/index"
	"github.com/phasegate/phasegate/network/leases"
	"github.com/phasegate/phasegate/network/pool"
	"github.com/phasegate/phasegate/network/reclaim"
	"github.com/phasegate/phasegate/network/reconcile"
	"github.com/phasegate/phasegate/network/slot"
	"github.com/phasegate/phasegate/phases/lockfile"
	"github.com/phasegate/phasegate/server"
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
	fds FDBudget  // how the daemon's descriptors are shared
	// What the background reclaim is paced by: observed by Acquire, the
	// pool's creations and the lag probe.
	waits waits

	// Built by the phases, each written once by its phase before any
	// dependent phase reads it: the lifecycle's ordering is the
	// synchronisation.
	lock       *lockfile.Lock
	cidrLock   *lockfile.Lock
	checkHost  bool          // the CIDR lock is new: check the host's use of it (reclaim)
	store      *leases.Store // the durable records (lock phase)
	safeMode   bool          // records lost: keep every slot something lives in
	stateLost  string        // why, for the health warning
	mgr        *slot.Manager
	plan       *restorePlan    // what the restore decided (reclaim phase)
	report     *reclaim.Report // the foreground reclaim's, when there is one
	unreadable []slot.Unreadable
	idx        *index.Allocator // built by storage, owned by the pool from populate on
	pool       *pool.Pool
	slots      *slotsService
	tcpGuard   *control.Guard  // the Slots API's on the port (New)
	ctl        *server.Server  // the control socket's server (lock phase)
	ctlGuard   *control.Guard  // its guard: every route there spends its rate
	ctlSocket  *control.Socket // its path, removed at an orderly stop
	ctlFile    *os.File        // its descriptor, for an upgrade
	deadDone   chan struct{}   // closed when the dead slots are reclaimed
	verifyDone chan struct{}   // closed when the restored leases' background check is over
	// The host's own addresses, read by the host check (reclaim) when it
	// ran, for the egress defaults (populate).
	hostAddrs     []netip.Prefix
	hostAddrsRead bool
	// The background reclaim's own context: a drain does not end it (the
	// pool's stop waits for it), its stop timeout or an upgrade does.
	reclaimCtx    context.Context
	cancelReclaim context.CancelFunc

	mu           sync.Mutex
	procScanSeen map[string]bool // /proc scan errors logged already
	lostSlots    []int           // indices of the leases lost since the start, sorted
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
	fds, err := cfg.readFDBudget()
	if err != nil {
		return nil, err
	}
	d := &Daemon{cfg: cfg, log: log, obs: &observer{}, fds: fds}
	log.Info("descriptors shared", fds.attrs()...)
	d.obs.acquireWait = &d.waits.acquire
	expected := cfg.Expected
	if expected == nil {
		expected = DefaultExpected()
	}
	a, err := app.New(app.Config{
		Name:              "phasegate",
		Version:           cfg.Version,
		Description:       "phasegate node daemon",
		Listen:            cfg.Listen,
		ListenAfter:       []string{PhaseLock},
		TLS:               cfg.TLS,
		RequireClientCert: cfg.RequireClientCert,
		Limits:            &d.fds.Port,
		// The guard is made once the App gives its meter; the port
		// serves nothing before that.
		GRPCOptions: append(d.obs.grpcOptions(), grpc.ChainUnaryInterceptor(d.waits.countChecks,
			func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
				return d.tcpGuard.Intercept(ctx, req, info, h)
			})),
		OnHTTPCheck:      func(string, int) { d.waits.checked() },
		StartTimeout:     cfg.StartTimeout,
		DrainDelay:       cfg.DrainDelay,
		StopTimeout:      cfg.StopTimeout,
		Expected:         expected,
		Logger:           log,
		TracerProvider:   cfg.TracerProvider,
		TraceExporters:   TraceExporters(),
		MetricExporters:  MetricExporters(),
		UpgradeOnHangup:  cfg.UpgradeOnHangup,
		UpgradePreflight: cfg.UpgradePreflight,
	}, d.graph()...)
	if err != nil {
		return nil, fmt.Errorf("phases: %w", err) // the config was validated: a bug in the graph
	}
	d.app, d.lc = a, a.Lifecycle()
	fail := func(err error) (*Daemon, error) {
		_ = a.Stop(context.Background()) // nothing started: releases the observers
		return nil, err
	}
	// A socket handed over (systemd, an upgrade) is served whatever
	// --listen says: the plain-text check applies to its address.
	if addr := a.HandedAddr(); addr != nil && !ListenIsLoopback(addr.String()) && cfg.TLS == nil && !cfg.Insecure {
		return fail(fmt.Errorf("%w: the listening socket handed over is %s, not a loopback address: give --tls-cert and --tls-key, or --insecure to serve in plain text", ErrConfig, addr))
	}
	if err := d.obs.init(a.MeterProvider()); err != nil {
		return fail(err)
	}
	d.obs.watchConns("port", a.Server())
	if d.tcpGuard, err = d.newGuard("tcp"); err != nil {
		return fail(err)
	}
	if err := a.Server().Declare(slotsServiceDesc()); err != nil {
		return fail(err)
	}
	return d, nil
}

// App returns the App that runs the daemon.
func (d *Daemon) App() *app.App { return d.app }

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
		{Name: PhaseLock, Run: d.runLocks, Stop: d.stopLocks, Timeout: d.cfg.LockWait + quickPhase},
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
	d.checkDrainDelay()
	if err := d.cfg.ensureStateDir(); err != nil {
		return lifecycle.Permanent(err)
	}
	path, err := d.cfg.LockPath()
	if err != nil {
		return lifecycle.Permanent(err)
	}
	if f := d.app.Inherited(lockHandover); f != nil {
		// An in-place upgrade: the old image kept the lock for us.
		legacy, err := lockfile.SlotsPath(lockfile.LegacyDir, d.cfg.Slots.NetnsDir, d.cfg.Slots.Prefix)
		if err != nil {
			return lifecycle.Permanent(err)
		}
		l, err := d.adoptLock(f, path, legacy, func() (*lockfile.Lock, error) { return d.acquireLock(ctx, path, 0) })
		if err != nil {
			return lifecycle.Permanent(asConfig(fmt.Errorf("the lock handed over by the previous image: %w", err)))
		}
		d.lock = l
		d.app.HandOver(lockHandover, l.File())
		p.SetMessage("kept across the upgrade")
		return nil
	}
	if d.cfg.LockWait > 0 {
		p.SetMessage("waiting up to " + d.cfg.LockWait.String() + " for " + path)
	}
	l, err := d.acquireLock(ctx, path, d.cfg.LockWait)
	if err != nil {
		return lifecycle.Permanent(err)
	}
	d.lock = l
	d.app.HandOver(lockHandover, l.File())
	return nil
}

// acquireLock takes the slots lock at path, waiting up to wait: a holder
// is a *SlotsHeldError, a lock directory another user could change a
// configuration error.
func (d *Daemon) acquireLock(ctx context.Context, path string, wait time.Duration) (*lockfile.Lock, error) {
	l, err := lockfile.Acquire(ctx, path, wait)
	if held := (*lockfile.HeldError)(nil); errors.As(err, &held) {
		return nil, d.cfg.HeldError(held)
	}
	return l, asConfig(err)
}

// openStore opens the records once the lock is held: only the holder of
// the slots may read and change what they are. It is the reclaim phase's
// first step rather than the lock's, so that the port binds while the
// file is opened and checked.
func (d *Daemon) openStore() error {
	st, err := d.openState()
	if err != nil {
		return lifecycle.Permanent(err)
	}
	d.store = st
	if d.stateLost != "" {
		d.lc.Warn(warnStateLost, d.stateLost+"; slots something lives in are kept and quarantined")
	}
	return nil
}

// lockHandover names the lock's descriptor across an in-place upgrade.
const lockHandover = "lock"

// stopLock closes the records and releases the lock, except for an
// upgrade: the new image takes the lock's descriptor over, so no other
// daemon can slip in between.
func (d *Daemon) stopLock(ctx context.Context) error {
	err := d.closeControl(ctx)
	if d.store != nil {
		err = errors.Join(err, d.store.Close())
	}
	if d.app.Upgrading() {
		return err
	}
	return errors.Join(err, d.lock.Unlock())
}

// Names of the daemon's health warnings and background tasks. A warning
// named like a running task is shown with the task's progress.
const (
	warnStateLost    = "state-lost"
	warnLeasesLost   = "leases-lost"
	warnEgress       = "egress"
	warnDrainDelay   = "drain-delay"
	taskReclaim      = "reclaim-dead"
	taskReconcile    = "reconcile"
	taskFill         = "fill"
	taskLeases       = "leases"
	taskVerify       = "verify-leases"
	taskVerifyInside = "verify-inside"
	taskCheckEgress  = "check-egress"
)

// readStart is what the reclaim phase reads before it changes anything:
// the host check (checkHostCIDR), the scan of the host and the records,
// three independent reads run at once, so that the phase waits for the
// longest rather than their sum. The scan is the package's read-only one
// (the manager, which makes the firewall table, comes after): a CIDR the
// host check refuses leaves nothing made on the host. Its refusal is the
// error returned whatever the others' outcome. Records are read beside the
// check only when their file exists: a first start has none to read, and
// a refused one must not leave a state file it made.
func (d *Daemon) readStart(ctx context.Context) (_ *slot.ScanResult, recs []leases.Record, bad []int, err error) {
	var (
		wg                 sync.WaitGroup
		hostErr, recordErr error
	)
	wg.Go(func() { hostErr = d.checkHostCIDR() })
	_, statErr := os.Lstat(d.cfg.StatePath())
	loadAfter := d.store == nil && errors.Is(statErr, fs.ErrNotExist)
	if !loadAfter {
		wg.Go(func() { recs, bad, recordErr = d.loadRecords() })
	}
	var sr *slot.ScanResult
	if d.mgr != nil {
		sr, err = d.mgr.Survey(ctx)
	} else {
		sr, err = slot.Survey(ctx, d.cfg.Slots)
	}
	wg.Wait()
	if err != nil {
		err = fmt.Errorf("scan: %w", err)
	}
	if hostErr != nil {
		return nil, nil, nil, hostErr
	}
	if loadAfter && err == nil {
		recs, bad, recordErr = d.loadRecords()
	}
	if err := errors.Join(err, recordErr); err != nil {
		return nil, nil, nil, err
	}
	return sr, recs, bad, nil
}

// loadRecords opens the records (once) and reads them: the indices of
// the unreadable ones are bad, sorted.
func (d *Daemon) loadRecords() ([]leases.Record, []int, error) {
	if d.store == nil {
		if err := d.openStore(); err != nil {
			return nil, nil, err
		}
	}
	recs, err := d.store.Load()
	var bad []int
	if re := (*leases.RecordsError)(nil); errors.As(err, &re) {
		for i := range re.Bad {
			bad = append(bad, i)
		}
		slices.Sort(bad)
	} else if err != nil {
		return nil, nil, lifecycle.Permanent(fmt.Errorf("load the records: %w", err))
	}
	return recs, bad, nil
}

// newManager makes the slot manager, which writes the slot table: its
// rules, and the egress defaults of every lease's policy, resolved here
// once (egressDefaults) with the host's addresses the host check read, or
// read now when it did not run.
func (d *Daemon) newManager(ctx context.Context) (*slot.Manager, error) {
	egress, err := egressDefaults(d.cfg, d.hostAddrs, d.hostAddrsRead)
	if err != nil {
		return nil, lifecycle.Permanent(fmt.Errorf("egress policy defaults: %w", err))
	}
	o := slot.DefaultOptions()
	o.Firewall, o.Egress = d.cfg.Firewall, egress
	return slot.NewManager(ctx, d.cfg.Slots, o)
}

// teardownOptions are the settings of every teardown but the start's.
func (d *Daemon) teardownOptions() slot.TeardownOptions {
	return slot.TeardownOptions{Workers: d.cfg.ReclaimWorkers, KillOrphans: d.cfg.ReclaimKillOrphans}
}

// runReclaim is the critical path of a restart: check that the host uses
// nothing of the slot CIDR, scan what is on the host and read the records
// (readStart, before anything is changed), match the two, restore the leases whose slots are intact
// (touching nothing inside them), adopt the idle ones, and decide what is
// dead. The dead are reclaimed here only with --reclaim=foreground; by
// default they are reclaimed in the background once the warm slots are
// made, so that serving never waits on the kernel's clean-up of the dead.
func (d *Daemon) runReclaim(ctx context.Context, p *lifecycle.Progress) error {
	start := time.Now()
	p.SetMessage("scanning")
	sr, recs, bad, err := d.readStart(ctx)
	if err != nil {
		return err
	}
	inv := sr.Inventory
	scanned := time.Since(start)
	if d.mgr == nil {
		mgr, err := d.newManager(ctx)
		if err != nil {
			return err
		}
		mgr.Surveyed(sr)
		d.mgr = mgr
	}
	d.unreadable = sr.Unreadable
	for _, u := range sr.Unreadable {
		d.log.Warn("netns entry could not be inspected: neither reclaimed nor handed out, quarantined", "slot", u.Index, "name", u.Name, "error", u.Err)
	}
	d.obs.unreadable(len(sr.Unreadable))
	if len(sr.Beyond) > 0 {
		d.log.Info("slots beyond --slots found (a run with more slots left them): reclaimed unless leased", "slots", fmt.Sprint(sr.Beyond))
	}
	plan, err := d.classify(ctx, recs, bad, inv)
	if err != nil {
		return err
	}
	if err := d.renewLeases(ctx, plan, time.Now()); err != nil {
		return err
	}
	d.plan = plan
	d.logPlan(plan)
	d.obs.restored(plan)
	trace.SpanFromContext(ctx).SetAttributes(
		attribute.Int("phasegate.restore.leases", len(plan.restored)),
		attribute.Int("phasegate.restore.adopted", len(plan.adopted)),
		attribute.Int("phasegate.restore.reclaim", len(plan.dead)),
		attribute.Int("phasegate.restore.lost", len(plan.lost)),
		attribute.Int("phasegate.restore.held", len(plan.held)),
		attribute.String("phasegate.restore.scan", scanned.String()),
	)
	if len(plan.lost) > 0 {
		var lost []leases.Record
		var reasons []string
		for _, l := range plan.lost {
			lost, reasons = append(lost, l.rec), append(reasons, l.lostReason)
		}
		d.reportLost(lost, reasons)
	}

	if !d.cfg.reclaimInForeground() || len(plan.dead) == 0 {
		p.SetMessage(plan.String())
		return nil
	}
	p.SetTotal(int64(len(plan.dead)), "namespaces")
	opts := reclaim.Options{
		Workers:     d.cfg.ReclaimWorkers,
		Budget:      d.cfg.ReclaimBudget,
		KillOrphans: d.cfg.ReclaimKillOrphans,
		Progress:    teardownProgress(p),
	}
	rep, err := reclaim.Slots(ctx, d.mgr, plan.dead, opts)
	if err != nil {
		return err
	}
	rep.Scan, rep.Unreadable = scanned, sr.Unreadable
	p.SetDone(int64(len(rep.Reclaimed)))
	d.report = rep
	d.obs.reclaimed(rep)
	d.logReport(rep)
	return nil
}

// checkDrainDelay warns when the drain is not longer than the interval of
// a checker that must see it: that checker may keep the daemon in rotation
// until the port closes (seen: a Consul check every 5s against a 2s drain).
func (d *Daemon) checkDrainDelay() {
	if d.cfg.CheckInterval == 0 || d.cfg.DrainDelay > d.cfg.CheckInterval {
		return
	}
	msg := fmt.Sprintf("--drain-delay %v is not longer than --check-interval %v: a checker may not see the drain before the port closes; raise --drain-delay (and the supervisor's stop timeout) or shorten the check's interval",
		d.cfg.DrainDelay, d.cfg.CheckInterval)
	d.log.Warn("drain shorter than a check interval", "drain_delay", d.cfg.DrainDelay, "check_interval", d.cfg.CheckInterval)
	d.lc.Warn(warnDrainDelay, msg)
}

// Messages of a teardown's progress: the count is of namespaces unlinked,
// and once it is complete the teardown still waits for the kernel to
// destroy them (their host links to vanish), which can take seconds.
const (
	msgUnlinking  = "unlinking"
	msgKernelWait = "all unlinked; waiting for the kernel to destroy them"
)

// teardownProgress is a reclaim's Progress callback that keeps p's count
// and its message saying the step under way: an earlier step's message
// (the scan's) would claim a step that is over.
func teardownProgress(p *lifecycle.Progress) func(done, total int) {
	p.SetMessage(msgUnlinking)
	return func(done, total int) {
		p.SetDone(int64(done))
		if done == total {
			p.SetMessage(msgKernelWait)
		}
	}
}

// checkEgress says what the slots' traffic to the outside needs and the
// host does not give: a log line each and a health warning.
func (d *Daemon) checkEgress(ctx context.Context) {
	rep := egress.Check(ctx, egress.Config{Table: d.mgr.Firewall().Name(), HostIfPrefix: d.cfg.Slots.Prefix + "h"})
	var warn []string
	for _, pr := range rep.Problems {
		if pr.Kind == egress.Unverifiable {
			d.log.Info("egress check: cannot verify", "problem", pr.Message)
			continue
		}
		d.log.Warn("egress check: slots cannot reach the outside", "kind", pr.Kind.String(), "problem", pr.Message)
		warn = append(warn, pr.Message)
	}
	if len(warn) > 0 {
		d.lc.Warn(warnEgress, strings.Join(warn, "; "))
	} else {
		d.lc.ClearWarning(warnEgress)
	}
	d.log.Info("egress check done", "warnings", len(warn))
}

// stopFirewall removes the daemon's nftables table once no slot is left in
// it, so a clean stop leaves nothing behind.
func (d *Daemon) stopFirewall(ctx context.Context) error {
	kept, err := dropEmptyFirewall(ctx, d.mgr)
	if kept > 0 {
		d.log.Warn("firewall table kept: slots still listed", "table", d.mgr.Firewall().Name(), "slots", kept)
	}
	return err
}

// dropEmptyFirewall deletes m's nftables table if its set lists no slot,
// and otherwise returns how many it lists: a table that still names slots
// (stuck ones) stays for the next reclaim.
func dropEmptyFirewall(ctx context.Context, m *slot.Manager) (kept int, err error) {
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
	if len(rep.Beyond) > 0 {
		attrs = append(attrs, "beyond", len(rep.Beyond))
	}
	if rep.Batches > 1 {
		attrs = append(attrs, "batches", rep.Batches)
	}
	d.log.Info("reclaim report", attrs...)
	d.logTeardownProblems(rep.Failed, rep.Orphans, rep.ProcScan, rep.WaitErr)
}

// logTeardownProblems logs what a teardown could not do or see: each
// failed slot, each process found inside a leaked namespace, and what kept
// the teardown from seeing everything (a /proc scan that could not read
// every process, a failed wait for the kernel).
func (d *Daemon) logTeardownProblems(failed []slot.Failure, orphans []slot.Orphan, procScan, waitErr error) {
	for _, f := range failed {
		d.log.Warn("slot teardown failed; quarantined for the reconciler", "slot", f.Index, "error", f.Err)
	}
	for _, o := range orphans {
		attrs := []any{"slot", o.Index, "pid", o.PID, "comm", o.Comm, "killed", o.Killed}
		if o.Gone {
			attrs = append(attrs, "gone", true)
		}
		if o.Err != nil {
			attrs = append(attrs, "error", o.Err)
		}
		d.log.Warn("process inside a leaked namespace", attrs...)
	}
	if procScan != nil {
		msg := procScan.Error()
		d.mu.Lock()
		seen := d.procScanSeen[msg]
		if d.procScanSeen == nil {
			d.procScanSeen = map[string]bool{}
		}
		d.procScanSeen[msg] = true
		d.mu.Unlock()
		if !seen { // the same process is unreadable at every pass
			d.log.Warn("process scan incomplete: namespaces of the processes it could not read are treated as held", "error", msg)
		}
	}
	if waitErr != nil {
		d.log.Warn("waiting for the kernel to remove host links failed; the links left were deleted", "error", waitErr)
	}
}

// runStorage builds the allocator from what the restore decided: the
// indices of restored leases, lost leases and adopted slots are taken,
// those of dead slots still to reclaim (in the background) and of slots
// kept in safe mode are quarantined, so that no index is ever handed out
// while something of another slot is still there. The pool, made from it
// next, owns it from then on: every later index change goes through the
// pool.
func (d *Daemon) runStorage(ctx context.Context, p *lifecycle.Progress) error {
	n := d.cfg.Slots.Slots
	var quarantine []int
	if d.report != nil {
		quarantine = d.report.Quarantine()
	}
	if !d.cfg.reclaimInForeground() {
		for i := range d.plan.dead {
			quarantine = append(quarantine, i)
		}
	}
	quarantine = append(append(quarantine, d.plan.held...), d.plan.bad...)
	for _, u := range d.unreadable {
		quarantine = append(quarantine, u.Index)
	}
	quarantine = slices.DeleteFunc(quarantine, func(i int) bool { return i > n })
	idx, err := index.New(n, quarantine)
	if err != nil {
		return lifecycle.Permanent(err)
	}
	for _, l := range append(slices.Clone(d.plan.restored), d.plan.lost...) {
		if l.rec.Index <= n {
			if err := idx.Claim(l.rec.Index); err != nil {
				return lifecycle.Permanent(fmt.Errorf("lease of slot %d: %w", l.rec.Index, err))
			}
		}
	}
	for _, s := range d.plan.adopted {
		if err := idx.Claim(s.Index); err != nil {
			return lifecycle.Permanent(fmt.Errorf("idle slot %d: %w", s.Index, err))
		}
	}
	d.idx = idx
	if q := idx.Quarantined(); len(q) > 0 {
		p.SetMessage(fmt.Sprintf("%d slots quarantined until reclaimed", len(q)))
	}
	return nil
}

// runPopulate makes the pool, with the adopted slots warm and the restored
// leases handed out, and waits for --pool-min-ready warm slots, made from
// free indices before any dead slot is reclaimed: making a slot then never
// waits on the kernel's clean-up of the dead. The reclaim of the dead, the
// rest of the fill and the reconciler go on in the background.
func (d *Daemon) runPopulate(ctx context.Context, p *lifecycle.Progress) error {
	if d.pool == nil {
		d.repairAdopted()
		var inUse []*slot.Slot
		for _, l := range d.plan.restored {
			inUse = append(inUse, l.slot)
		}
		// The lost leases' indices runStorage claimed, for PutLost.
		var lost []int
		for _, l := range d.plan.lost {
			if l.rec.Index <= d.cfg.Slots.Slots {
				lost = append(lost, l.rec.Index)
			}
		}
		pl, err := pool.New(timedSlots{Slots: d.mgr, create: &d.waits.create}, d.idx, pool.Options{
			Target:   d.cfg.PoolSize,
			Grace:    d.cfg.PoolGrace,
			Teardown: d.teardownOptions(),
			Idle:     d.plan.adopted,
			InUse:    inUse,
			Lost:     lost,
			OnMade:   d.recordIdle,
			OnGone:   d.forget,
		})
		if err != nil {
			return lifecycle.Permanent(err)
		}
		d.pool = pl
		d.obs.setPool(pl)
		d.slots = newSlotsService(d.mgr, pl, d.store, append(slices.Clone(d.plan.restored), d.plan.lost...),
			d.log, d.app.TracerProvider().Tracer(meterScope), d.obs.leaseEvent, d)
		d.slots.impaired = d.impairedFor
		d.obs.setLeases(d.slots)
	}
	if err := d.reclaimForWarm(ctx, p); err != nil {
		return err
	}
	p.SetTotal(int64(d.cfg.PoolMinReady), "warm slots")
	stopWatch := watchPool(d.pool, p)
	err := d.pool.WaitReady(ctx, d.cfg.PoolMinReady)
	stopWatch()
	if err != nil {
		return fmt.Errorf("wait for %d warm slots: %w (last pool error: %v)", d.cfg.PoolMinReady, err, d.pool.Snapshot().LastError)
	}
	p.SetDone(int64(d.cfg.PoolMinReady))

	d.verifyDone = make(chan struct{})
	if restored := d.plan.restored; len(restored) > 0 {
		p.Defer(taskVerify, func(ctx context.Context, tp *lifecycle.Progress) error {
			defer close(d.verifyDone)
			return d.verifyLeases(ctx, tp, restored)
		})
	} else {
		close(d.verifyDone)
	}
	d.deadDone = make(chan struct{})
	d.reclaimCtx, d.cancelReclaim = context.WithCancel(context.Background())
	if dead := d.deadToReclaim(); len(dead) > 0 {
		p.Defer(taskReclaim, func(ctx context.Context, tp *lifecycle.Progress) error {
			defer close(d.deadDone)
			// After the leases' check: both need the kernel's networking
			// lock, and owners wait for the check (a Release, a retry),
			// not for the dead.
			select {
			case <-d.verifyDone:
			case <-ctx.Done():
				return ctx.Err()
			}
			return d.reclaimDead(ctx, tp, dead)
		})
	} else {
		close(d.deadDone)
	}
	p.Defer(taskReconcile, d.runReconciler)
	// Once the daemon serves: it only warns, and it lists every chain of
	// the host's nftables, the leases' egress chains among them, which
	// the kernel dumps in O(chains²) (each message of the dump walks the
	// list again from its start): with 10,000 leases it was the largest
	// part of a restart's critical path.
	p.Defer(taskCheckEgress, func(ctx context.Context, _ *lifecycle.Progress) error {
		d.checkEgress(ctx)
		return nil
	})
	p.Defer(taskVerifyInside, func(ctx context.Context, tp *lifecycle.Progress) error {
		// After the leases' check: a lease it finds lost has no slot to
		// look into.
		select {
		case <-d.verifyDone:
		case <-ctx.Done():
			return nil
		}
		return d.verifyInside(ctx, tp, d.plan.restored)
	})
	if d.cfg.PoolSize > d.cfg.PoolMinReady {
		p.Defer(taskFill, func(ctx context.Context, tp *lifecycle.Progress) error {
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

// reclaimForWarm reclaims, before the warm slots are awaited, as many dead
// slots as --pool-min-ready needs and no free index can give: on a host
// whose every index is leaked, the background reclaim (which starts once
// the warm slots are made) would otherwise wait for a warm slot that
// waits for it. Those reclaimed are left out of the background's share.
func (d *Daemon) reclaimForWarm(ctx context.Context, p *lifecycle.Progress) error {
	dead := d.deadToReclaim()
	need := d.cfg.PoolMinReady - len(d.pool.Snapshot().Idle) - d.pool.Indices().Free
	if need <= 0 || len(dead) == 0 {
		return nil
	}
	var pick []int
	for _, i := range dead.Indices() {
		if i <= d.cfg.Slots.Slots && len(pick) < need {
			pick = append(pick, i)
		}
	}
	p.SetMessage(fmt.Sprintf("no free index: reclaiming %d dead slots first", len(pick)))
	rep, err := reclaim.Slots(ctx, d.mgr, dead.Only(pick), reclaim.Options{
		Workers: d.cfg.ReclaimWorkers, KillOrphans: d.cfg.ReclaimKillOrphans,
	})
	if err != nil {
		return err
	}
	for _, i := range rep.Reclaimed {
		if ferr := d.pool.Free(i); ferr != nil {
			d.log.Warn("reclaimed slot's index could not be freed", "slot", i, "error", ferr)
		}
		delete(d.plan.dead, i)
	}
	d.obs.reclaimed(rep)
	d.logReport(rep)
	return nil
}

// deadToReclaim is what the background reclaim has to do: the dead slots,
// unless the reclaim phase did them.
func (d *Daemon) deadToReclaim() slot.Inventory {
	if d.cfg.reclaimInForeground() {
		return nil
	}
	return d.plan.dead
}

// reclaimDead tears the dead slots down in the background, paced so that
// health checks and Acquire stay fast, and frees their indices as they go.
// While it runs /health says warn, with its progress, rate and time left.
//
// A stop halts it at the end of the batch in hand (about a second): the
// slots started are finished whole, the rest is left for the next start,
// which reclaims it in the background again; the lifecycle waits for the
// task before the pool's stop. An upgrade cuts it short at once: the new
// image reclaims what is left.
func (d *Daemon) reclaimDead(ctx context.Context, p *lifecycle.Progress, dead slot.Inventory) error {
	d.lc.Warn(taskReclaim, fmt.Sprintf("reclaiming %d dead slots in the background", len(dead)))
	defer d.lc.ClearWarning(taskReclaim)
	p.SetTotal(int64(len(dead)), "namespaces")
	halt := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		if d.app.Upgrading() {
			d.cancelReclaim()
		}
		close(halt)
	})
	defer stop()
	// Batches paced by the daemon's own waits: the kernel holds its
	// networking lock while it destroys a batch, and a slot made meanwhile
	// (an Acquire on an empty pool, the fill) waits for it, as a health
	// answer waits for the CPU the destruction takes. Big batches are the
	// fastest overall (docs/benchmarks/batches.md), so they grow while
	// nothing waits too long, and shrink, with pauses, when something does.
	pacer, stopProbe, err := d.newPacer()
	if err != nil {
		return err
	}
	defer reclaimProcs(d.cfg.ReclaimWorkers)()
	rep, err := reclaim.Slots(d.reclaimCtx, d.mgr, dead, reclaim.Options{
		Halt:        halt,
		Workers:     d.cfg.ReclaimWorkers,
		Nice:        reclaimNice,
		KillOrphans: d.cfg.ReclaimKillOrphans,
		Pacer:       pacer,
		Progress:    teardownProgress(p),
	})
	stopProbe()
	st := pacer.Stats()
	d.log.Info("background reclaim paced", "batches", st.Batches, "slowed", st.Slowed, "largest_batch", st.Largest,
		"paused", st.Paused.Round(time.Millisecond).String(), "over", fmt.Sprint(st.Over))
	n := d.cfg.Slots.Slots
	for _, i := range rep.Reclaimed {
		if i > n {
			continue
		}
		if ferr := d.pool.Free(i); ferr != nil {
			d.log.Warn("reclaimed slot's index could not be freed", "slot", i, "error", ferr)
		}
	}
	d.report = rep
	d.obs.reclaimed(rep)
	d.logReport(rep)
	if ctx.Err() != nil {
		return ctx.Err() // the drain: what is left waits for the next start
	}
	return err
}

// runReconciler sweeps quarantined and stray slots every interval, once
// the background reclaim of the dead is over (they would fight over the
// same indices). Its passes are logged when they do something or fail, and
// counted.
func (d *Daemon) runReconciler(ctx context.Context, _ *lifecycle.Progress) error {
	select {
	case <-d.deadDone:
	case <-ctx.Done():
		return ctx.Err()
	}
	// Slots kept in safe mode, and those whose record cannot be read, may
	// be somebody's workload: quarantined, never torn down by a pass.
	keep := map[int]bool{}
	if d.plan != nil {
		for _, i := range slices.Concat(d.plan.held, d.plan.bad) {
			keep[i] = true
		}
	}
	rec := reconcile.New(d.mgr, d.pool, reconcile.Options{
		Interval: d.cfg.ReconcileInterval,
		Teardown: d.teardownOptions(),
		OnPass:   d.reconciled,
		Keep:     func(i int) bool { return keep[i] },
	})
	err := rec.Run(ctx)
	if ctx.Err() != nil {
		return ctx.Err() // stopped by the drain: not a fault
	}
	return err
}

// reconciled logs and counts a reconcile pass: at info when it freed or
// claimed slots, at warn when it failed, and not at all when it found
// nothing to do.
func (d *Daemon) reconciled(pass reconcile.Pass) {
	d.obs.reconciled(pass)
	if pass.Scan != nil {
		d.log.Warn("reconcile pass could not scan the host", "error", pass.Scan)
		return
	}
	for _, u := range pass.Unreadable {
		d.log.Warn("netns entry could not be inspected: left alone, quarantined", "slot", u.Index, "name", u.Name, "error", u.Err)
	}
	var orphans []slot.Orphan
	var procScan, waitErr error
	if t := pass.Teardown; t != nil {
		orphans, procScan, waitErr = t.Orphans, t.ProcScan, t.WaitErr
	}
	d.logTeardownProblems(pass.Failed, orphans, procScan, waitErr)
	if len(pass.Claimed) > 0 || len(pass.Freed) > 0 || len(pass.Beyond) > 0 {
		d.log.Info("reconcile pass", "claimed", fmt.Sprint(pass.Claimed), "freed", len(pass.Freed), "beyond", fmt.Sprint(pass.Beyond),
			"failed", len(pass.Failed), "duration", pass.Duration.Round(time.Millisecond).String())
	}
}

// recordIdle records a slot the pool made (pool.Options.OnMade), so that a
// restart adopts it.
func (d *Daemon) recordIdle(ctx context.Context, s *slot.Slot) error {
	now := time.Now()
	return d.store.Put(ctx, leases.Record{Index: s.Index, State: leases.Idle, Netns: s.NetnsID, HostIfindex: s.HostIfIndex, Created: now})
}

// forget deletes the records of slots the pool tore down
// (pool.Options.OnGone). A record left behind would only be found stale at
// the next start.
func (d *Daemon) forget(indices []int) {
	if err := d.store.Delete(context.Background(), indices...); err != nil {
		d.log.Warn("records of slots torn down could not be deleted", "slots", fmt.Sprint(indices), "error", err)
	}
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

// stopPool waits for the background reclaim of dead slots to end, then
// stops the pool and keeps its warm slots, recorded, for the next start to
// adopt; leased slots are not touched: a restart, an upgrade
// or a stop never cuts a workload off. `phasegate decommission` destroys
// everything.
func (d *Daemon) stopPool(ctx context.Context) error {
	select {
	case <-d.deadDone:
	case <-ctx.Done():
		d.cancelReclaim()
		<-d.deadDone
		d.log.Warn("stop: the background reclaim was cut short; the next start reclaims the rest")
	}
	kept, err := d.pool.Stop(ctx)
	held, lost := d.slots.counts()
	d.log.Info("pool stopped: slots kept for the next start", "warm", len(kept), "leased", held-lost, "lost_leases", lost)
	return err
}

func (d *Daemon) runRegister(_ context.Context, p *lifecycle.Progress) error {
	// The port serves the Slots API only to clients with a verified
	// certificate (the guard refuses the others); the control socket to
	// whom the kernel names.
	if err := d.app.Server().Bind(slotsServiceName, d.slots); err != nil {
		return lifecycle.Permanent(err)
	}
	if err := d.ctl.Bind(slotsServiceName, d.slots); err != nil {
		return lifecycle.Permanent(err)
	}
	if err := d.ctl.BindHTTP(pathDebugSlots, d.ctlGuard.HTTP(d.slots.debugHandler())); err != nil {
		return lifecycle.Permanent(err)
	}
	p.Defer(taskLeases, func(ctx context.Context, _ *lifecycle.Progress) error {
		if err := d.slots.runExpiry(ctx, time.Second); ctx.Err() == nil {
			return err
		}
		return ctx.Err()
	})
	return nil
}
