// Command serialbaseline starts the way E2B's orchestrator did before its
// fix, for the benchmark (../, mode serial) to measure phasegate against:
// take the slots' lock, tear every slot found on the host down one at a
// time (no records: everything found is dead), build the free indices,
// make the warm slots, and only then bind the port and serve health.
//
// It is no part of phasegate: it composes the library's exported parts
// (app, lifecycle, network/slot, phases/lockfile) in the serial
// orchestrator's order, so that the daemon's configuration and flags carry
// only what an operator would set. Through app it serves what the
// benchmark reads of a phasegate daemon: /health and grpc.health.v1 from
// the moment the port binds, /debug/lifecycle with its phases and the
// background "fill" task, and, in its JSON log, a "reclaim report" line
// with the daemon's fields (found, reclaimed, failed, cut_off, duration:
// the teardown, the scan apart). SIGTERM drains and exits 0, keeping the
// warm slots, as the daemon does; `phasegate decommission` removes them.
//
//	go build -o /tmp/serialbaseline ./bench/serialbaseline
//	sudo /tmp/serialbaseline --listen=127.0.0.1:5009 --slot-prefix=bz --netns-dir=/run/netns-bz --slots=1000
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"time"

	"github.com/phasegate/phasegate/app"
	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/network/slot"
	"github.com/phasegate/phasegate/phases/lockfile"
	"github.com/phasegate/phasegate/test/internal/serialteardown"
)

// Phase names: the daemon's, so that the benchmark's timelines of both
// read alike; the port (app's listen) binds after populate.
const (
	phaseLock     = "lock"
	phaseReclaim  = "reclaim"
	phaseStorage  = "storage"
	phasePopulate = "populate"
	taskFill      = "fill" // what the benchmark waits for before it reads RSS
)

// config is the baseline's settings; the flags that share a meaning with
// `phasegate serve`'s have its names.
type config struct {
	listen       string
	slots        slot.Config
	poolSize     int
	poolMinReady int
	drainDelay   time.Duration
	stopTimeout  time.Duration
}

func main() {
	cfg, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "serialbaseline:", err)
		os.Exit(2)
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	b := &baseline{cfg: cfg, log: log}
	a, err := app.New(app.Config{
		Name:        "serialbaseline",
		Version:     "baseline",
		Description: "E2B's orchestrator start, for the benchmark",
		Listen:      cfg.listen,
		ListenAfter: []string{phasePopulate}, // the serial orchestrator's order: the port binds last
		DrainDelay:  cfg.drainDelay,
		StopTimeout: cfg.stopTimeout,
		Logger:      log,
	}, b.graph()...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "serialbaseline:", err)
		os.Exit(2)
	}
	os.Exit(a.Main())
}

// parseFlags reads the command line.
func parseFlags(args []string) (config, error) {
	cfg := config{slots: slot.DefaultConfig()}
	fs := flag.NewFlagSet("serialbaseline", flag.ContinueOnError)
	fs.StringVar(&cfg.listen, "listen", "127.0.0.1:5008", "TCP address of the port (gRPC and HTTP), bound once the warm slots are made")
	fs.StringVar(&cfg.slots.NetnsDir, "netns-dir", cfg.slots.NetnsDir, "directory of the network namespace files")
	fs.StringVar(&cfg.slots.Prefix, "slot-prefix", cfg.slots.Prefix, "prefix of every name it owns (netns <prefix><i>, host veth <prefix>h<i>)")
	fs.IntVar(&cfg.slots.Slots, "slots", cfg.slots.Slots, "number of slot indices, 1..N")
	fs.Func("slot-cidr", "IPv4 network the slots' /31s are cut from (default "+cfg.slots.CIDR.String()+")", func(s string) error {
		p, err := netip.ParsePrefix(s)
		cfg.slots.CIDR = p
		return err
	})
	fs.IntVar(&cfg.poolSize, "pool-size", 16, "warm slots made")
	fs.IntVar(&cfg.poolMinReady, "pool-min-ready", 1, "warm slots made before the port binds; the rest fills in the background")
	fs.DurationVar(&cfg.drainDelay, "drain-delay", 5*time.Second, "time between health turning NOT_SERVING and the port stopping")
	fs.DurationVar(&cfg.stopTimeout, "stop-timeout", 10*time.Second, "bound on the graceful stop of the port")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	switch {
	case fs.NArg() > 0:
		return cfg, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	case cfg.poolMinReady < 0 || cfg.poolMinReady > cfg.poolSize || cfg.poolSize > cfg.slots.Slots:
		return cfg, fmt.Errorf("want 0 ≤ --pool-min-ready (%d) ≤ --pool-size (%d) ≤ --slots (%d)", cfg.poolMinReady, cfg.poolSize, cfg.slots.Slots)
	}
	return cfg, cfg.slots.Validate()
}

// baseline is what the phases build, each written by its phase before the
// next one reads it: the lifecycle's ordering is the synchronisation.
type baseline struct {
	cfg  config
	log  *slog.Logger
	lock *lockfile.Lock
	mgr  *slot.Manager
	kept map[int]bool // indices the reclaim could not free (reclaim)
	free []int        // indices free after the reclaim, ascending (storage)
	made int          // warm slots made (populate, then fill)
}

// graph declares the phases in the serial orchestrator's order; app adds
// listen (after populate) and serve.
func (b *baseline) graph() []lifecycle.Phase {
	return []lifecycle.Phase{
		{Name: phaseLock, Run: b.runLock, Stop: b.stopLock},
		{Name: phaseReclaim, DependsOn: []string{phaseLock}, Run: b.runReclaim},
		{Name: phaseStorage, DependsOn: []string{phaseReclaim}, Run: b.runStorage},
		{Name: phasePopulate, DependsOn: []string{phaseStorage}, Run: b.runPopulate},
	}
}

// runLock takes the lock every phasegate takes on these slots, so that
// the baseline and a daemon or `phasegate decommission` never work on
// them at once.
func (b *baseline) runLock(ctx context.Context, _ *lifecycle.Progress) error {
	path, err := lockfile.SlotsPath(lockfile.DefaultDir, b.cfg.slots.NetnsDir, b.cfg.slots.Prefix)
	if err != nil {
		return lifecycle.Permanent(err)
	}
	if b.lock, err = lockfile.Acquire(ctx, path, 0); err != nil {
		return lifecycle.Permanent(err)
	}
	return nil
}

func (b *baseline) stopLock(context.Context) error { return b.lock.Unlock() }

// runReclaim scans the host and tears down every slot found, one after
// the other: the orchestrator kept no records, so whatever an earlier run
// left is dead.
func (b *baseline) runReclaim(ctx context.Context, p *lifecycle.Progress) error {
	mgr, err := slot.NewManager(ctx, b.cfg.slots, slot.DefaultOptions())
	if err != nil {
		return lifecycle.Permanent(err)
	}
	b.mgr = mgr
	start := time.Now()
	p.SetMessage("scanning")
	sr, err := mgr.Survey(ctx)
	if err != nil {
		return fmt.Errorf("scan: %w", err)
	}
	scan := time.Since(start)
	for _, u := range sr.Unreadable {
		b.log.Warn("netns entry could not be inspected: left alone", "slot", u.Index, "name", u.Name, "error", u.Err)
	}
	p.SetTotal(int64(len(sr.Inventory)), "namespaces")
	t0 := time.Now()
	res := serialteardown.Teardown(ctx, mgr, sr.Inventory, 0, func(done, _ int) { p.SetDone(int64(done)) })
	took := time.Since(t0)
	for _, f := range res.Failed {
		b.log.Warn("slot teardown failed; its index is not used", "slot", f.Index, "error", f.Err)
	}
	// The daemon's field names: the benchmark reads both alike.
	b.log.Info("reclaim report",
		"found", len(sr.Inventory), "reclaimed", len(res.Reclaimed), "failed", len(res.Failed),
		"deferred", len(res.Deferred), "cut_off", 0,
		"duration", took.Round(time.Millisecond).String(), "scan", scan.Round(time.Millisecond).String())
	b.kept = map[int]bool{}
	for _, f := range res.Failed {
		b.kept[f.Index] = true
	}
	for _, u := range sr.Unreadable {
		b.kept[u.Index] = true
	}
	return ctx.Err()
}

// runStorage lists the free indices: all of 1..N but those whose teardown
// failed or that could not be inspected.
func (b *baseline) runStorage(context.Context, *lifecycle.Progress) error {
	for i := 1; i <= b.cfg.slots.Slots; i++ {
		if !b.kept[i] {
			b.free = append(b.free, i)
		}
	}
	return nil
}

// runPopulate makes --pool-min-ready warm slots, one at a time, and hands
// the rest of the pool to a background task; the port binds after it.
func (b *baseline) runPopulate(ctx context.Context, p *lifecycle.Progress) error {
	if len(b.free) < b.cfg.poolSize {
		return lifecycle.Permanent(fmt.Errorf("%d free indices for a pool of %d", len(b.free), b.cfg.poolSize))
	}
	p.SetTotal(int64(b.cfg.poolMinReady), "warm slots")
	if err := b.fill(ctx, p, b.cfg.poolMinReady); err != nil {
		return err
	}
	if b.cfg.poolSize > b.made {
		p.Defer(taskFill, func(ctx context.Context, tp *lifecycle.Progress) error {
			tp.SetTotal(int64(b.cfg.poolSize), "warm slots")
			return b.fill(ctx, tp, b.cfg.poolSize)
		})
	}
	return nil
}

// fill makes warm slots from the free indices until there are target.
func (b *baseline) fill(ctx context.Context, p *lifecycle.Progress, target int) error {
	for b.made < target {
		i := b.free[b.made]
		if _, err := b.mgr.Create(ctx, i); err != nil {
			return fmt.Errorf("warm slot %d: %w", i, err)
		}
		b.made++
		p.SetDone(int64(b.made))
	}
	return nil
}
