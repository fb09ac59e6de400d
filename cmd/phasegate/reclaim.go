package main

import (
	"context"
	"errors"
	"flag"
	"fmt"

	"github.com/phasegate/phasegate/network/reclaim"
	"github.com/phasegate/phasegate/network/slot"
	"github.com/phasegate/phasegate/phases"
	"github.com/phasegate/phasegate/phases/lockfile"
)

// reclaimCmd tears down leaked slots once, without a daemon: for a host that
// will not run phasegate again, or to measure a reclaim. It takes the
// daemon's lock, so it refuses to run beside one.
func reclaimCmd(ctx context.Context, e env) int {
	cfg := phases.DefaultConfig()
	var lf logFlags
	fs := flag.NewFlagSet("reclaim", flag.ContinueOnError)
	slotFlags(fs, &cfg)
	dryRun := fs.Bool("dry-run", false, "list what would be reclaimed and change nothing")
	lf.register(fs)
	if err := parseFlags(fs, e.args, e.lookupEnv); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			usage(e.stdout, fs, "reclaim [flags]")
			return exitOK
		}
		fmt.Fprintf(e.stderr, "phasegate reclaim: %s\n", oneLine(err))
		return exitUsage
	}
	if err := cfg.Validate(); err != nil {
		fmt.Fprintf(e.stderr, "phasegate reclaim: %s\n", oneLine(err))
		return exitUsage
	}
	lockPath, err := cfg.LockPath()
	if err != nil {
		fmt.Fprintf(e.stderr, "phasegate reclaim: %v\n", err)
		return exitUsage
	}
	if held, pid, err := lockfile.Probe(ctx, lockPath); err != nil {
		fmt.Fprintf(e.stderr, "phasegate reclaim: %v\n", err)
		return exitUsage
	} else if held {
		fmt.Fprintf(e.stderr, "phasegate reclaim: %v; a daemon reclaims by itself\n", cfg.HeldError(&lockfile.HeldError{Path: lockPath, PID: pid}))
		return exitFailed
	}
	log := lf.logger(e.stderr)
	if *dryRun {
		return reclaimDryRun(ctx, e, cfg)
	}
	if err := lockfile.EnsureDir(cfg.StateDir); err != nil {
		fmt.Fprintf(e.stderr, "phasegate reclaim: %v\n", err)
		return exitUsage
	}
	lock, err := lockfile.Acquire(ctx, lockPath, 0)
	if held := (*lockfile.HeldError)(nil); errors.As(err, &held) {
		fmt.Fprintf(e.stderr, "phasegate reclaim: %v\n", cfg.HeldError(held))
		return exitFailed
	}
	if err != nil {
		fmt.Fprintf(e.stderr, "phasegate reclaim: %v\n", err)
		return exitFailed
	}
	defer lock.Unlock()
	mgr, err := slot.NewManager(ctx, cfg.Slots, slot.Options{})
	if err != nil {
		fmt.Fprintf(e.stderr, "phasegate reclaim: %v\n", err)
		return exitFailed
	}
	rep, err := reclaim.Run(ctx, mgr, reclaim.Options{
		Workers:     cfg.ReclaimWorkers,
		Budget:      cfg.ReclaimBudget,
		KillOrphans: cfg.ReclaimKillOrphans,
	})
	if err != nil {
		fmt.Fprintf(e.stderr, "phasegate reclaim: %v\n", err)
		return exitFailed
	}
	if kept, err := phases.DropEmptyFirewall(ctx, mgr); err != nil {
		log.Warn("removing the firewall table", "error", err)
	} else if kept > 0 {
		log.Warn("firewall table kept: slots still listed", "slots", kept)
	}
	fmt.Fprintln(e.stdout, rep.String())
	if len(rep.Failed) > 0 || len(rep.Deferred) > 0 {
		return exitFailed
	}
	return exitOK
}

// reclaimDryRun lists leaked slots without creating the netns directory or
// the firewall table, so it changes nothing on the host.
func reclaimDryRun(ctx context.Context, e env, cfg phases.Config) int {
	inv, err := slot.Scan(ctx, cfg.Slots)
	if err != nil {
		fmt.Fprintf(e.stderr, "phasegate reclaim: %v\n", err)
		return exitFailed
	}
	for _, i := range inv.Indices() {
		fmt.Fprintf(e.stdout, "%d\t%s\t%s\n", i, cfg.Slots.NetnsName(i), inv[i])
	}
	fmt.Fprintf(e.stdout, "%d leaked slots would be reclaimed\n", len(inv))
	return exitOK
}
