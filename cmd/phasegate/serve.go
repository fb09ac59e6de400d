package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/phasegate/phasegate/app"
	"github.com/phasegate/phasegate/control"
	"github.com/phasegate/phasegate/network/slot"
	"github.com/phasegate/phasegate/phases"
	"github.com/phasegate/phasegate/tracing"
)

// logFlags are the logging settings every long-running command takes.
type logFlags struct {
	format, level string
}

func (l *logFlags) register(fs *flag.FlagSet) {
	l.format, l.level = "text", "info"
	fs.Var(choiceValue{&l.format, []string{"text", "json"}}, "log-format", "log format: text or json")
	fs.Var(choiceValue{&l.level, []string{"debug", "info", "warn", "error"}}, "log-level", "least level logged: debug, info, warn, error")
}

func (l *logFlags) logger(w io.Writer) *slog.Logger {
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(l.level))
	opts := &slog.HandlerOptions{Level: lvl}
	if l.format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// slotFlags registers the flags that say where slots live and how they are
// reclaimed: shared by serve and reclaim.
func slotFlags(fs *flag.FlagSet, cfg *phases.Config) {
	fs.StringVar(&cfg.StateDir, "state-dir", cfg.StateDir, "directory of the slots' durable records, "+phases.StateFileName+" (created 0700; tmpfs, so they vanish at reboot with the namespaces; root's and writable by no one else)")
	fs.StringVar(&cfg.LockDir, "lock-dir", cfg.LockDir, "directory of the locks every phasegate on the host shares: give every daemon and command on a host the same one (created 0700; root's and writable by no one else)")
	fs.StringVar(&cfg.Slots.NetnsDir, "netns-dir", cfg.Slots.NetnsDir, "directory of the network namespace files")
	fs.StringVar(&cfg.Slots.Prefix, "slot-prefix", cfg.Slots.Prefix, "prefix of every name this daemon owns (netns <prefix><i>, host veth <prefix>h<i>)")
	fs.IntVar(&cfg.Slots.Slots, "slots", cfg.Slots.Slots, "number of slot indices, 1..N (unset with --slot-cidr given: as many as it holds, a /31 each, at most the default)")
	fs.Var(prefixValue(&cfg.Slots.CIDR), "slot-cidr", "IPv4 network the slots' /31s are cut from")
	fs.Var(prefixValue(&cfg.Slots.CIDR6), "slot-cidr6", "IPv6 network the slots' /127s are cut from, one beside each /31 (unset: IPv6 is off in every slot)")
	fs.IntVar(&cfg.ReclaimWorkers, "reclaim-workers", cfg.ReclaimWorkers, "concurrent namespace teardowns during reclaim")
	fs.DurationVar(&cfg.ReclaimBudget, "reclaim-budget", cfg.ReclaimBudget, "time reclaim may take before the rest is deferred to the background (0: reclaim everything first)")
	fs.BoolVar(&cfg.ReclaimKillOrphans, "reclaim-kill-orphans", cfg.ReclaimKillOrphans, "kill processes found inside leaked namespaces (otherwise they are reported and cut off)")
	fs.Var(choiceValue{&cfg.ReclaimMode, []string{phases.ReclaimBackground, phases.ReclaimForeground}}, "reclaim",
		"when leaked slots are torn down: background (after serving) or foreground (before the warm slots are made)")
	fs.BoolVar(&cfg.Firewall.AllowSlotToSlot, "allow-slot-to-slot", cfg.Firewall.AllowSlotToSlot, "let slots reach each other (dropped by default: slots are tenants)")
	fs.Var(portsValue{&cfg.Firewall.HostTCPPorts}, "slot-host-tcp-ports", "TCP ports of the host that slots may reach at their gateway, comma-separated (none by default)")
	fs.Var(portsValue{&cfg.Firewall.HostUDPPorts}, "slot-host-udp-ports", "UDP ports of the host that slots may reach at their gateway, comma-separated (none by default)")
}

// fitSlots makes the default --slots what a given --slot-cidr holds, up
// to the default: `--slot-cidr 10.99.0.0/24` alone means 128 slots, not
// a refusal. A --slots given (or PHASEGATE_SLOTS) is left as it is, and a
// CIDR too small for one slot to Validate's error.
func fitSlots(fs *flag.FlagSet, cfg *phases.Config) {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if set["slots"] || !set["slot-cidr"] {
		return
	}
	if n := slot.Capacity(cfg.Slots.CIDR); n >= 1 && n < cfg.Slots.Slots {
		cfg.Slots.Slots = n
	}
}

// serveOptions are serve's settings that are not the daemon's Config.
type serveOptions struct {
	log   logFlags
	check bool // print the resolved configuration and exit
}

// serveFlags parses serve's command line and environment into a Config.
func serveFlags(e env) (phases.Config, serveOptions, error) {
	cfg := phases.DefaultConfig()
	cfg.Version = version
	var opts serveOptions
	lf := &opts.log
	var tf tlsFlags
	var cf controlFlags
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.StringVar(&cfg.Listen, "listen", cfg.Listen, "TCP address of the one port for gRPC and HTTP")
	fs.IntVar(&cfg.PortConnsPerPeer, "port-conns-per-peer", cfg.PortConnsPerPeer, "connections one peer (a local user, or a remote address) may hold on the port; raise it when many clients share one address (0: the default, 64)")
	fs.DurationVar(&cfg.LockWait, "lock-wait", cfg.LockWait, "how long to wait for a lock held by another instance (0: fail at once)")
	slotFlags(fs, &cfg)
	fs.IntVar(&cfg.PoolSize, "pool-size", cfg.PoolSize, "warm slots kept ready")
	fs.IntVar(&cfg.PoolMinReady, "pool-min-ready", cfg.PoolMinReady, "warm slots needed before serving; the rest fills in the background")
	fs.BoolVar(&cfg.ReleaseKillOrphans, "release-kill-orphans", cfg.ReleaseKillOrphans, "kill processes still inside a slot's namespace when its lease ends (a release, an expiry); otherwise they are cut off with it, still running. Either way one log line names them")
	fs.DurationVar(&cfg.PoolGrace, "pool-grace", cfg.PoolGrace, "how long an idle slot above --pool-size is kept")
	fs.DurationVar(&cfg.PopulateTimeout, "populate-timeout", cfg.PopulateTimeout, "bound on each of populate's 3 attempts to make --pool-min-ready warm slots (0: none)")
	fs.DurationVar(&cfg.ReconcileInterval, "reconcile-interval", cfg.ReconcileInterval, "how often the host is checked against what the daemon holds: strays swept, leased slots broken from outside found lost or repaired, the state directory and the control socket checked")
	fs.DurationVar(&cfg.StartTimeout, "start-timeout", cfg.StartTimeout, "bound on the whole start; past it the daemon exits 1 naming the phase (0: none)")
	fs.DurationVar(&cfg.DrainDelay, "drain-delay", cfg.DrainDelay, "time between health turning NOT_SERVING and the servers stopping")
	fs.DurationVar(&cfg.CheckInterval, "check-interval", cfg.CheckInterval, "the longest interval of a health check that takes this daemon out of rotation (0: unknown); warns at start when --drain-delay is not longer")
	fs.DurationVar(&cfg.StopTimeout, "stop-timeout", cfg.StopTimeout, "bound on the graceful stop of the servers")
	tf.register(fs)
	cf.register(fs)
	guestFlags(fs, &cfg)
	fs.Var(expectValue{&cfg.Expected}, "expect", "phase=duration,…: log a warning, with the progress, when a phase runs longer")
	fs.BoolVar(&cfg.UpgradeOnHangup, "upgrade-on-hup", cfg.UpgradeOnHangup, "SIGHUP upgrades in place: check the binary at this path, drain keeping slots, port and lock, exec it (false: SIGHUP stops)")
	fs.BoolVar(&opts.check, "check", false, "check the configuration, print it resolved with the worst-case start and stop times, and exit (0 valid, 2 not)")
	lf.register(fs)
	if err := parseFlags(fs, e.args, e.lookupEnv); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			usage(e.stdout, fs, "serve [flags]")
		}
		return cfg, opts, err
	}
	fitSlots(fs, &cfg)
	// The files are read through e.configFiles: an upgrade reads them
	// again at SIGHUP and hands the new image what it read.
	tc, err := tf.config(e.configFiles)
	if err != nil {
		return cfg, opts, err
	}
	cfg.TLS, cfg.RequireClientCert, cfg.Insecure = tc, tf.clientCA != "", tf.insecure
	if cfg.Control, err = cf.config(fs, e.configFiles); err != nil {
		return cfg, opts, err
	}
	cfg.ConfigFiles = e.configFiles
	return cfg, opts, nil
}

// oneLine joins a multi-line error (errors.Join) for a one-line report.
func oneLine(err error) string {
	return strings.ReplaceAll(err.Error(), "\n", "; ")
}

func serveCmd(ctx context.Context, e env) int {
	cfg, opts, err := serveFlags(e)
	lf := opts.log
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(e.stderr, "phasegate serve: %s\n", oneLine(err))
		return exitUsage
	}
	if err := cfg.Validate(); err != nil {
		fmt.Fprintf(e.stderr, "phasegate serve: %s\n", oneLine(err))
		return exitUsage
	}
	if opts.check {
		return checkConfig(ctx, e, cfg)
	}
	// The new binary of an upgrade is checked with our own arguments.
	cfg.UpgradePreflight = append(append([]string{"serve"}, e.args...), "--check")
	// Checks that change nothing, so that a second instance or a taken port
	// is reported before anything is created. An image started by an
	// in-place upgrade holds the lock and the port already, and one
	// started by systemd socket activation the port.
	if _, upgraded := e.lookupEnv(app.UpgradeFDsEnv); upgraded {
		return runDaemon(ctx, e, cfg, lf)
	}
	if code, done := e.refuseIfHeld(ctx, "serve", cfg, ""); done {
		return code
	}
	if err := checkControlSocket(ctx, cfg); err != nil {
		fmt.Fprintf(e.stderr, "phasegate serve: %v\n", err)
		return exitUsage
	}
	if pid, ok := e.lookupEnv("LISTEN_PID"); !ok || pid != strconv.Itoa(os.Getpid()) {
		if err := portFree(cfg.Listen); err != nil {
			fmt.Fprintf(e.stderr, "phasegate serve: --listen %s: %v\n", cfg.Listen, err)
			return exitUsage
		}
	}
	return runDaemon(ctx, e, cfg, lf)
}

// runDaemon runs the daemon until it stops and returns the exit code.
func runDaemon(ctx context.Context, e env, cfg phases.Config, lf logFlags) int {
	log := lf.logger(e.stderr)
	tp, err := tracing.Setup(ctx, tracing.WithVersion(version), tracing.WithExporters(phases.TraceExporters()...))
	if err != nil {
		fmt.Fprintf(e.stderr, "phasegate serve: %v\n", err)
		return exitUsage
	}
	defer func() {
		if err := tp.Shutdown(context.WithoutCancel(ctx)); err != nil {
			log.Warn("flushing traces", "error", err)
		}
	}()
	cfg.Logger = log
	cfg.TracerProvider = tp
	d, err := phases.New(cfg)
	if err != nil {
		fmt.Fprintf(e.stderr, "phasegate serve: %s\n", oneLine(err))
		if errors.Is(err, phases.ErrConfig) {
			return exitUsage
		}
		return exitFailed
	}
	log.Info("phasegate starting", "version", version, "listen", cfg.Listen, "tls", cfg.TLS != nil,
		"client_certs", cfg.RequireClientCert, "netns_dir", cfg.Slots.NetnsDir,
		"prefix", cfg.Slots.Prefix, "slots", cfg.Slots.Slots, "traces", tp.Exporter)
	if cfg.TLS == nil && !phases.ListenIsLoopback(cfg.Listen) {
		log.Warn("INSECURE: serving health and metrics in plain text on a non-loopback address (--insecure); the Slots API is served there to nobody without mutual TLS", "listen", cfg.Listen)
	}
	if err := d.Run(ctx); err != nil {
		// The log said it all; this is the one line a supervisor's
		// journal shows last.
		fmt.Fprintf(e.stderr, "phasegate serve: %s\n", oneLine(err))
		if errors.Is(err, phases.ErrConfig) || errors.Is(err, app.ErrConfig) {
			return exitUsage
		}
		return exitFailed
	}
	return exitOK
}

// checkControlSocket refuses, before anything is created, a control socket
// path a live process answers on (Validate refused what is not a socket).
// A state directory still to be made holds no socket.
func checkControlSocket(ctx context.Context, cfg phases.Config) error {
	path := cfg.ControlSocket()
	if _, err := os.Stat(filepath.Dir(path)); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return control.CheckSocket(ctx, path)
}

// portFree reports whether addr can be bound now. Port 0 always can.
func portFree(addr string) error {
	if _, port, err := net.SplitHostPort(addr); err == nil && port == "0" {
		return nil
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		var op *net.OpError
		if errors.As(err, &op) && op.Err != nil {
			return op.Err
		}
		return err
	}
	return l.Close()
}

// resolvedConfig is what `serve --check` prints: the settings that decide
// what the daemon touches and how long it may take to start and stop.
type resolvedConfig struct {
	Listen          string  `json:"listen"`
	TLS             bool    `json:"tls"`
	ClientCerts     bool    `json:"client_certs"`
	StateDir        string  `json:"state_dir"`
	ControlSocket   string  `json:"control_socket"`
	ControlGID      int     `json:"control_gid"`
	ControlRules    int     `json:"control_rules"`
	MaxLeases       int     `json:"max_leases"`
	MaxPorts        int     `json:"max_ports"`
	ControlRate     float64 `json:"control_rate"`
	Lock            string  `json:"lock"`
	NetnsDir        string  `json:"netns_dir"`
	Prefix          string  `json:"slot_prefix"`
	Slots           int     `json:"slots"`
	SlotCIDR        string  `json:"slot_cidr"`
	SlotCIDR6       string  `json:"slot_cidr6,omitempty"`
	PoolSize        int     `json:"pool_size"`
	PoolMinReady    int     `json:"pool_min_ready"`
	StartTimeout    string  `json:"start_timeout"`
	PopulateTimeout string  `json:"populate_timeout"`
	DrainDelay      string  `json:"drain_delay"`
	StopTimeout     string  `json:"stop_timeout"`
	// StopBudget is the worst-case time of an orderly stop; a supervisor's
	// kill timeout must exceed it.
	StopBudget        string  `json:"stop_budget"`
	StopBudgetSeconds float64 `json:"stop_budget_seconds"`
	// StartBudget is the longest a start can take before it fails (the
	// phases' timeouts and retries along the slowest chain, at most
	// StartTimeout); a supervisor's start timeout must exceed it.
	StartBudget        string  `json:"start_budget"`
	StartBudgetSeconds float64 `json:"start_budget_seconds"`
	// OpenFiles is the soft RLIMIT_NOFILE the daemon runs with, and the
	// connections of the port and of the control socket what it leaves
	// them (docs/SECURITY.md).
	OpenFiles        uint64 `json:"open_files"`
	FDReserve        int    `json:"fd_reserve"`
	PortConns        int    `json:"port_conns"`
	PortConnsPerPeer int    `json:"port_conns_per_peer"`
	ControlConns     int    `json:"control_conns"`
}

// checkConfig prints the resolved configuration as JSON. It builds the
// daemon, which touches nothing on the host until it runs, to compute the
// stop budget from the same phases the daemon would run.
func checkConfig(ctx context.Context, e env, cfg phases.Config) int {
	d, err := phases.New(cfg)
	if err != nil {
		fmt.Fprintf(e.stderr, "phasegate serve: %s\n", oneLine(err))
		return exitUsage
	}
	defer func() { _ = d.App().Stop(ctx) }()
	lock, err := cfg.LockPath()
	if err != nil {
		fmt.Fprintf(e.stderr, "phasegate serve: %v\n", err)
		return exitUsage
	}
	budget, start := d.StopBudget(), d.App().StartBudget()
	fds := d.Descriptors()
	out, _ := json.MarshalIndent(resolvedConfig{
		Listen: cfg.Listen, TLS: cfg.TLS != nil, ClientCerts: cfg.RequireClientCert,
		StateDir: cfg.StateDir, Lock: lock,
		ControlSocket: cfg.ControlSocket(), ControlGID: cfg.Control.GID,
		ControlRules: len(cfg.Control.Policy.Rules), MaxLeases: cfg.ControlPolicy().Quota(), MaxPorts: cfg.ControlPolicy().PortQuota(), ControlRate: cfg.Control.Policy.Rate, NetnsDir: cfg.Slots.NetnsDir, Prefix: cfg.Slots.Prefix,
		Slots: cfg.Slots.Slots, SlotCIDR: cfg.Slots.CIDR.String(), SlotCIDR6: cidr6(cfg.Slots.CIDR6),
		PoolSize: cfg.PoolSize, PoolMinReady: cfg.PoolMinReady,
		StartTimeout: cfg.StartTimeout.String(), PopulateTimeout: cfg.PopulateTimeout.String(),
		DrainDelay: cfg.DrainDelay.String(), StopTimeout: cfg.StopTimeout.String(),
		StopBudget: budget.String(), StopBudgetSeconds: budget.Seconds(),
		StartBudget: start.String(), StartBudgetSeconds: start.Seconds(),
		OpenFiles: fds.Soft, FDReserve: fds.Reserve, PortConns: fds.Port.MaxConns,
		PortConnsPerPeer: fds.Port.MaxConnsPerPeer, ControlConns: fds.Control.MaxConns,
	}, "", "  ")
	fmt.Fprintln(e.stdout, string(out))
	return exitOK
}

// cidr6 is --slot-cidr6 as the resolved configuration shows it: "" unset.
func cidr6(p netip.Prefix) string {
	if !p.IsValid() {
		return ""
	}
	return p.String()
}
