package phases

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/phasegate/phasegate/app"
	"github.com/phasegate/phasegate/control"
	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/network/index"
	"github.com/phasegate/phasegate/network/leases"
	"github.com/phasegate/phasegate/network/pool"
	"github.com/phasegate/phasegate/network/reclaim"
	"github.com/phasegate/phasegate/network/slot"
	"github.com/phasegate/phasegate/phases/lease"
	"github.com/phasegate/phasegate/phases/lockfile"
	"github.com/phasegate/phasegate/phases/slotsapi"
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
	cidrLocks  []*lockfile.Lock    // the slot ranges' locks (claimCIDR)
	cidrHanded map[string]*os.File // the range locks the previous image handed over, by handover name (New); none but in an upgrade
	store      *leases.Store       // the durable records (lock phase)
	records    *lease.Records      // their only writer from the restore on (reclaim)
	state      *stateWatch         // the state directory's health (statedir.go)
	lost       recordsLost         // the records lost, when they were (reclaim)
	held       *lease.HeldSlots    // the slots held (reclaim phase on)
	mgr        *slot.Manager
	plan       *restorePlan    // what the restore decided (reclaim phase)
	report     *reclaim.Report // the foreground reclaim's, when there is one (storage reads its quarantine)
	unreadable []slot.Unreadable
	idx        *index.Allocator // built by storage, owned by the pool from populate on
	pool       *pool.Pool
	slots      *lease.Service      // the lease core (populate)
	restore    *lease.RestoreCheck // the check of the restored leases (populate)
	tcpGuard   *control.Guard      // the Slots API's on the port (New)
	ctl        controlSocket       // the control socket (lock phase)
	bg         background          // the background tasks' handles (populate)
	// The host's own addresses, read by the host check (New) when it
	// ran, for the egress defaults (populate).
	host hostAddrs

	mu           sync.Mutex
	procScanSeen map[string]bool // /proc scan errors logged already
}

// controlSocket is the daemon's control socket: its server, its guard
// (every route there spends its rate), its path (removed at an orderly
// stop) and its descriptor (for an upgrade).
type controlSocket struct {
	srv    *server.Server
	guard  *control.Guard
	socket *control.Socket
	file   *os.File
}

// recordsLost is what the start knows of records it lost: whether it
// keeps every slot something lives in (safe mode), why, for the health
// warning, and the journal's writes lost, when it lost them.
type recordsLost struct {
	safeMode bool
	why      string
	journal  *leases.JournalLoss
}

// background holds the handles of the background tasks others wait for:
// the dead slots reclaimed, the restored leases' check over, and the
// background reclaim's own context, which a drain does not end (the
// pool's stop waits for it) but its stop timeout or an upgrade does.
type background struct {
	deadDone      chan struct{}
	verifyDone    chan struct{}
	reclaimCtx    context.Context
	cancelReclaim context.CancelFunc
}

// hostAddrs are the host's own addresses and whether they were read
// (by the host check, or beside the scan when it did not run before the
// port), and what became of the host check: passed before the port, or
// left until after it (hostCheckedBefore); neither in an upgrade's new
// image.
type hostAddrs struct {
	addrs   []netip.Prefix
	read    bool
	checked bool
	later   bool
}

// New validates cfg, checks that the host uses nothing of the slot CIDR
// nor of the guest network (a configuration error names what does), and
// declares the daemon's phases, its port and its API. Nothing on the host
// is created or changed until it runs.
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
	d := &Daemon{cfg: cfg, log: log, obs: &observer{}, fds: fds, state: newStateWatch(cfg, log)}
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
		OnHTTPCheck:  func(string, int) { d.waits.checked() },
		StartTimeout: cfg.StartTimeout,
		DrainDelay:   cfg.DrainDelay,
		StopTimeout:  cfg.StopTimeout,
		Expected:     expected,
		// The lock phase makes the state directory or checks that only
		// root controls it, reclaim that the state file is no link:
		// nothing of the history is read or written there before, nor
		// after a start either refused.
		History:          filepath.Join(cfg.StateDir, HistoryFileName),
		HistoryAfter:     PhaseReclaim,
		Logger:           log,
		TracerProvider:   cfg.TracerProvider,
		TraceExporters:   TraceExporters(),
		MetricExporters:  MetricExporters(),
		UpgradeOnHangup:  cfg.UpgradeOnHangup,
		UpgradePreflight: cfg.UpgradePreflight,
		ConfigFiles:      cfg.ConfigFiles,
	}, d.graph()...)
	if err != nil {
		return nil, fmt.Errorf("phases: %w", err) // the config was validated: a bug in the graph
	}
	d.app, d.lc = a, a.Lifecycle()
	d.state.health = d.lc
	fail := func(err error) (*Daemon, error) {
		_ = a.Stop(context.Background()) // nothing started: releases the observers
		return nil, err
	}
	if err := d.checkHost(a); err != nil {
		return fail(err)
	}
	if err := d.obs.init(a.MeterProvider()); err != nil {
		return fail(err)
	}
	d.obs.watchConns("port", a.Server())
	if d.tcpGuard, err = d.newGuard("tcp"); err != nil {
		return fail(err)
	}
	if err := a.Server().Declare(slotsapi.Desc()); err != nil {
		return fail(err)
	}
	log.Info("descriptors shared", fds.attrs()...)
	return d, nil
}

// checkHost refuses, before anything is locked, bound or made, what only
// the host can tell is wrong, each a configuration error said in one line:
// a socket handed over (systemd, an upgrade), served whatever --listen
// says, in plain text on an address that is not loopback; and a slot CIDR
// or guest network the host uses (checkHostCIDR), but in an upgrade's new
// image, whose host is its own, and in a restart of a configuration the
// check passed earlier in this boot, which checks after the port
// (hostCheckedBefore).
func (d *Daemon) checkHost(a *app.App) error {
	if addr := a.HandedAddr(); addr != nil && !ListenIsLoopback(addr.String()) && d.cfg.TLS == nil && !d.cfg.Insecure {
		return fmt.Errorf("%w: the listening socket handed over is %s, not a loopback address: give --tls-cert and --tls-key, or --insecure to serve in plain text", ErrConfig, addr)
	}
	if d.inheritCIDRLocks(a) {
		return nil
	}
	if d.hostCheckedBefore() {
		d.host.later = true
		return nil
	}
	return d.checkHostCIDR()
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

// Names of the daemon's health warnings and background tasks. A warning
// named like a running task is shown with the task's progress.
const (
	warnStateLost     = "state-lost"
	warnHeld          = lease.WarnHeld
	warnLeasesLost    = lease.WarnLeasesLost
	warnEgress        = "egress"
	warnHostOverlap   = "host-overlap"
	warnDrainDelay    = "drain-delay"
	warnSlotsBroken   = lease.WarnSlotsBroken
	warnPool          = "pool"
	warnStateDir      = "state-dir"
	warnControlSocket = "control-socket"
	taskReclaim       = "reclaim-dead"
	taskReconcile     = "reconcile"
	taskFill          = "fill"
	taskLeases        = "leases"
	taskVerify        = "verify-leases"
	taskVerifyInside  = "verify-inside"
	taskCheckEgress   = "check-egress"
	taskWatchHost     = "watch-host"
	taskWatch         = "watch"
)
