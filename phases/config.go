package phases

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/phasegate/phasegate/app"
	"github.com/phasegate/phasegate/internal/rootdir"
	"github.com/phasegate/phasegate/network/egress"
	"github.com/phasegate/phasegate/network/nft"
	"github.com/phasegate/phasegate/network/reconcile"
	"github.com/phasegate/phasegate/network/slot"
	"github.com/phasegate/phasegate/phases/internal/flagname"
	"github.com/phasegate/phasegate/phases/lockfile"
)

// Reclaim modes (Config.ReclaimMode).
const (
	ReclaimBackground = "background"
	ReclaimForeground = "foreground"
)

// ErrConfig is wrapped by every error [Config.Validate] returns: the daemon
// exits 2 on it, before it creates or touches anything.
var ErrConfig = errors.New("configuration")

// Config is everything the daemon's phases need. [DefaultConfig] gives the
// documented defaults.
type Config struct {
	// Listen is the TCP address of the one port (gRPC and HTTP).
	Listen string
	// StateDir holds the daemon's state; created 0700 if missing. Only
	// root may control it and every directory above it (docs/SECURITY.md,
	// "Files only root controls").
	StateDir string
	// LockDir holds the slot and CIDR locks (see [lockfile.SlotsPath]);
	// created 0700 if missing, and only root may control it, as StateDir.
	// Every phasegate on a host must use the same one: the default,
	// [lockfile.DefaultDir], unless all are told another.
	LockDir string
	// LockWait is how long to wait for a lock held by another instance;
	// zero fails at once.
	LockWait time.Duration
	// Slots says where and how network slots are made.
	Slots slot.Config
	// ReclaimWorkers bounds concurrent namespace teardowns during reclaim.
	ReclaimWorkers int
	// ReclaimBudget bounds the reclaim phase; what is left is deferred to
	// the background reconciler and quarantined meanwhile. Zero reclaims
	// everything before storage is built.
	ReclaimBudget time.Duration
	// ReclaimKillOrphans ends processes found inside leaked namespaces;
	// without it they are reported and cut off.
	ReclaimKillOrphans bool
	// ReleaseKillOrphans ends processes still inside a slot's namespace
	// when its lease ends (a Release, an expiry); without it they are cut
	// off with the namespace. Either way one line names them.
	ReleaseKillOrphans bool
	// ReclaimMode says when dead slots (leaked by an earlier run) are torn
	// down: ReclaimBackground after the daemon serves (the default: a
	// restart serves in the time of a scan, whatever the host's state), or
	// ReclaimForeground before the warm slots are made.
	ReclaimMode string
	// Firewall is what slots may reach: each other (off by default) and
	// the host's own services (none by default, bar replies and ping of
	// their own gateway).
	Firewall nft.Isolation
	// Egress is the daemon's part of every lease's egress policy: the
	// always-allowed and always-denied sets (the host's own addresses are
	// added to the latter at start) and the egress proxy's port.
	Egress egress.Defaults
	// PoolSize is how many warm slots the pool keeps.
	PoolSize int
	// PoolMinReady is how many warm slots the populate phase waits for;
	// the rest fills in the background.
	PoolMinReady int
	// PoolGrace is how long an idle slot above PoolSize is kept.
	PoolGrace time.Duration
	// PopulateTimeout bounds each attempt of the populate phase (three
	// attempts); zero means no bound.
	PopulateTimeout time.Duration
	// StartTimeout bounds the whole start; zero means no bound. A start
	// that outlives it fails, naming the phase and its progress, and the
	// daemon exits 1.
	StartTimeout time.Duration
	// ReconcileInterval is the period of the daemon's checks of the host
	// against what it holds: the reconciler's pass (strays, quarantine,
	// and the leased slots broken from outside: lost or repaired), and the
	// check of the state directory and the control socket. A slot broken
	// while the daemon runs is seen within one interval.
	ReconcileInterval time.Duration
	// DrainDelay is the time between health turning NOT_SERVING and the
	// servers stopping, for checkers to notice and in-flight calls to end.
	DrainDelay time.Duration
	// CheckInterval is the longest interval at which a health checker that
	// takes the daemon out of rotation polls it (zero: unknown). A drain
	// not longer than it may pass unseen, so the daemon warns at start.
	CheckInterval time.Duration
	// StopTimeout bounds the graceful stop of the servers and each stop
	// function.
	StopTimeout time.Duration
	// TLS, when set, secures the port (gRPC and HTTP alike).
	TLS *tls.Config
	// RequireClientCert makes the Slots API accept only clients whose
	// certificate TLS.ClientCAs verifies; health stays open to checkers.
	RequireClientCert bool
	// Insecure allows a non-loopback Listen without TLS.
	Insecure bool
	// PortConnsPerPeer bounds the connections one peer may hold on the
	// port (a local user, or a remote address); zero is
	// server.DefaultMaxConnsPerPeer. Raise it when many clients share one
	// address (a proxy, a NAT).
	PortConnsPerPeer int
	// Control is the control surface: the socket the Slots API is served
	// on, and who may do what there.
	Control ControlConfig
	// Expected maps a phase to the time after which, still running, it is
	// logged as slow with its progress; nil means [DefaultExpected], a
	// zero duration never warns.
	Expected map[string]time.Duration
	// UpgradeOnHangup makes SIGHUP an in-place upgrade (see
	// [app.Config.UpgradeOnHangup]): the binary at the daemon's path is
	// checked with UpgradePreflight, the daemon drains keeping its slots,
	// its port and its lock, and executes it as the same process.
	UpgradeOnHangup bool
	// UpgradePreflight are the arguments the new binary is checked with
	// (the daemon's own with --check).
	UpgradePreflight []string
	// ConfigFiles is what the policy file and the TLS files were read
	// through: an upgrade reads them again at SIGHUP, with the same
	// checks, and hands the new image what it read (see
	// [app.Config.ConfigFiles]). Nil: they are not handed over.
	ConfigFiles *app.ConfigFiles
	// Version is reported by health endpoints and spans.
	Version string
	// Logger receives the daemon's logs; nil discards them.
	Logger *slog.Logger
	// TracerProvider receives the phases' spans; nil records none.
	TracerProvider trace.TracerProvider
}

// DefaultConfig returns the daemon's defaults.
func DefaultConfig() Config {
	return Config{
		Listen:            "127.0.0.1:5008",
		StateDir:          "/run/phasegate",
		LockDir:           lockfile.DefaultDir,
		Slots:             slot.DefaultConfig(),
		Egress:            egress.Defaults{AlwaysDeny: slices.Clone(egress.DefaultAlwaysDeny)},
		Control:           ControlConfig{GID: -1},
		ReclaimWorkers:    slot.DefaultWorkers,
		ReclaimMode:       ReclaimBackground,
		PoolSize:          16,
		PoolMinReady:      1,
		PoolGrace:         5 * time.Minute,
		PopulateTimeout:   time.Minute,
		StartTimeout:      5 * time.Minute,
		UpgradeOnHangup:   true,
		ReconcileInterval: reconcile.DefaultInterval,
		DrainDelay:        5 * time.Second,
		StopTimeout:       10 * time.Second,
		Version:           "dev",
	}
}

// Validate checks the configuration without changing anything on the host
// and returns every problem found, joined, each wrapping [ErrConfig].
func (c Config) Validate() error {
	var p problems
	c.checkListen(&p)
	c.checkDirs(&p)
	c.checkDurations(&p)
	c.checkSlotRules(&p)
	c.checkPool(&p)
	return errors.Join(p...)
}

// problems collects what is wrong with a configuration, each wrapping
// [ErrConfig].
type problems []error

func (p *problems) add(format string, a ...any) {
	*p = append(*p, fmt.Errorf("%w: "+format, append([]any{ErrConfig}, a...)...))
}

// checkListen checks the port's address, its TLS and its bound per peer.
func (c Config) checkListen(p *problems) {
	if host, port, err := net.SplitHostPort(c.Listen); err != nil {
		p.add("--listen %q: %v", c.Listen, err)
	} else if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		p.add("--listen %q: port must be a number in [0, 65535]", c.Listen)
	} else if host != "" && net.ParseIP(host) == nil && host != "localhost" {
		p.add("--listen %q: host must be an IP address or localhost", c.Listen)
	}
	if !ListenIsLoopback(c.Listen) && c.TLS == nil && !c.Insecure {
		p.add("--listen %s is not a loopback address: give --tls-cert and --tls-key, or --insecure to serve in plain text", c.Listen)
	}
	if c.RequireClientCert && (c.TLS == nil || c.TLS.ClientCAs == nil) {
		p.add("--tls-client-ca needs --tls-cert and --tls-key")
	}
	if c.PortConnsPerPeer < 0 {
		p.add("--port-conns-per-peer is %d, must not be negative", c.PortConnsPerPeer)
	}
}

// checkDirs checks the directories and the slots.
func (c Config) checkDirs(p *problems) {
	if err := checkRootDir("--state-dir", c.StateDir); err != nil {
		p.add("%v", err)
	} else if err := stateDirWritable(c.StateDir); err != nil {
		p.add("%v", err)
	} else if err := c.validateControl(); err != nil {
		p.add("%v", err)
	}
	if err := checkRootDir("--lock-dir", c.LockDir); err != nil {
		p.add("%v", err)
	}
	if err := checkDir("--netns-dir", c.Slots.NetnsDir); err != nil {
		p.add("%v", err)
	}
	if err := c.Slots.Validate(); err != nil {
		for _, e := range unjoin(err) {
			p.add("%s", flagname.Shown(e))
		}
	}
}

// checkDurations checks that no duration flag is negative.
func (c Config) checkDurations(p *problems) {
	nonNegative := func(flag string, d time.Duration) {
		if d < 0 {
			p.add("%s is %v, must not be negative", flag, d)
		}
	}
	nonNegative("--lock-wait", c.LockWait)
	nonNegative("--reclaim-budget", c.ReclaimBudget)
	nonNegative("--drain-delay", c.DrainDelay)
	nonNegative("--check-interval", c.CheckInterval)
	nonNegative("--start-timeout", c.StartTimeout)
	nonNegative("--populate-timeout", c.PopulateTimeout)
}

// checkSlotRules checks the reclaim mode and the slots' firewall and egress rules.
func (c Config) checkSlotRules(p *problems) {
	if c.ReclaimMode != ReclaimBackground && c.ReclaimMode != ReclaimForeground {
		p.add("--reclaim %q: want %s or %s", c.ReclaimMode, ReclaimBackground, ReclaimForeground)
	}
	if err := c.Firewall.Validate(); err != nil {
		p.add("firewall policy: %v", err)
	}
	if err := c.Egress.Validate(); err != nil {
		p.add("--slot-egress-allow, --slot-egress-deny: %v", err)
	}
	if port := c.Egress.ProxyPort; port != 0 && !slices.Contains(c.Firewall.HostTCPPorts, port) {
		p.add("--slot-egress-proxy-port %d is not in --slot-host-tcp-ports: the slot firewall would drop what is sent to the proxy", port)
	}
}

// checkPool checks the pool, the workers and the timers of the background work.
func (c Config) checkPool(p *problems) {
	if c.ReclaimWorkers < 1 {
		p.add("--reclaim-workers is %d, want at least 1", c.ReclaimWorkers)
	}
	switch {
	case c.PoolSize < 0:
		p.add("--pool-size is %d, must not be negative", c.PoolSize)
	case c.Slots.Slots > 0 && c.PoolSize > c.Slots.Slots:
		p.add("--pool-size %d is larger than --slots %d", c.PoolSize, c.Slots.Slots)
	}
	switch {
	case c.PoolMinReady < 0:
		p.add("--pool-min-ready is %d, must not be negative", c.PoolMinReady)
	case c.PoolMinReady > c.PoolSize:
		p.add("--pool-min-ready %d is larger than --pool-size %d", c.PoolMinReady, c.PoolSize)
	}
	if c.PoolGrace <= 0 {
		p.add("--pool-grace is %v, must be positive", c.PoolGrace)
	}
	if c.ReconcileInterval <= 0 {
		p.add("reconcile interval is %v, must be positive", c.ReconcileInterval)
	}
	if c.StopTimeout <= 0 {
		p.add("--stop-timeout is %v, must be positive", c.StopTimeout)
	}
}

// reclaimInForeground: dead slots are torn down before the warm slots are
// made.
func (c Config) reclaimInForeground() bool {
	return c.ReclaimMode == ReclaimForeground
}

// LockPath is the lock file that guards this configuration's slots: the
// same for every daemon and every `phasegate reclaim` that works on the
// same prefix in the same netns directory, whatever their state
// directories.
func (c Config) LockPath() (string, error) {
	return lockfile.SlotsPath(c.LockDir, c.Slots.NetnsDir, c.Slots.Prefix)
}

// HeldError wraps a lock held by another process with what it guards.
func (c Config) HeldError(held *lockfile.HeldError) *SlotsHeldError {
	return &SlotsHeldError{Prefix: c.Slots.Prefix, NetnsDir: c.Slots.NetnsDir, Lock: held}
}

// SlotsHeldError reports that another process holds the slots of a prefix
// in a netns directory: a second daemon, or `phasegate reclaim`, beside a
// running one.
type SlotsHeldError struct {
	Prefix, NetnsDir string
	Lock             *lockfile.HeldError
}

func (e *SlotsHeldError) Error() string {
	return fmt.Sprintf("another phasegate (%s) holds the slots of prefix %q in %s (lock %s)",
		e.Lock.Holder(), e.Prefix, e.NetnsDir, e.Lock.Path)
}

// Unwrap returns the lock's own error.
func (e *SlotsHeldError) Unwrap() error { return e.Lock }

// ListenIsLoopback reports whether addr listens on loopback only.
func ListenIsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// checkDir accepts an absolute path that is a directory, or that does not
// exist yet but whose parent does (it is created at start, as iproute2 and
// systemd's RuntimeDirectory do). A file or a symlink is refused.
func checkDir(flag, dir string) error {
	if !filepath.IsAbs(dir) {
		return fmt.Errorf("%s %q must be an absolute path", flag, dir)
	}
	fi, err := os.Lstat(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		parent := filepath.Dir(dir)
		if pfi, err := os.Stat(parent); err != nil || !pfi.IsDir() {
			return fmt.Errorf("%s %s: parent directory %s does not exist", flag, dir, parent)
		}
		return nil
	case err != nil:
		return fmt.Errorf("%s %s: %v", flag, dir, err)
	case fi.Mode()&os.ModeSymlink != 0:
		return fmt.Errorf("%s %s is a symlink; give the real path", flag, dir)
	case !fi.IsDir():
		return fmt.Errorf("%s %s is not a directory", flag, dir)
	}
	return nil
}

// checkRootDir is checkDir for a directory only root may control: it and
// every directory above it must be root's and writable by no one else (a
// sticky directory above aside), and not a link (rootdir's rule). The one
// line names the path, its owner and its mode.
func checkRootDir(flag, dir string) error {
	if !filepath.IsAbs(dir) {
		return checkDir(flag, dir)
	}
	if err := rootdir.Check(dir); err != nil {
		return fmt.Errorf("%s %w", flag, err)
	}
	return nil
}

func unjoin(err error) []error {
	if u, ok := err.(interface{ Unwrap() []error }); ok {
		return u.Unwrap()
	}
	return []error{err}
}

// DefaultExpected are the durations after which a phase still running is
// logged as slow, with its progress: far above what a healthy host takes
// (docs/BENCHMARKS.md: thousands of namespaces reclaimed in seconds, a
// warm slot in milliseconds), well below what an orchestrator's start
// budget allows.
func DefaultExpected() map[string]time.Duration {
	return map[string]time.Duration{
		PhaseReclaim:  time.Minute,
		PhasePopulate: 30 * time.Second,
	}
}

// withinSlots reports whether slot index i is one the pool may hand out
// (at most --slots). A slot beyond it, which a run with more slots left,
// is reclaimed unless leased, and its lease is lost: it never takes an
// index of the pool.
func (c Config) withinSlots(i int) bool { return i <= c.Slots.Slots }
