package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/phasegate/phasegate/network/leases"
	"github.com/phasegate/phasegate/network/slot"
	"github.com/phasegate/phasegate/phases"
	"github.com/phasegate/phasegate/phases/lockfile"
)

// oneShotConfig is the configuration of a command that runs once, without
// a daemon (reclaim, decommission): the daemon's, without a pool, so that
// --slots below the default pool size is valid.
func oneShotConfig() phases.Config {
	cfg := phases.DefaultConfig()
	cfg.PoolSize, cfg.PoolMinReady = 0, 0
	return cfg
}

// oneShotSwitch is the one boolean flag a one-shot command adds to the
// slots' and the log's flags (reclaim's --dry-run, decommission's
// --destroy-leased-slots).
type oneShotSwitch struct{ name, usage string }

// oneShot is a one-shot command's parsed flags.
type oneShot struct {
	cfg phases.Config
	log logFlags
	on  bool // the command's switch
}

// parseOneShot parses the flags of one-shot command name: the slots' and
// the log's over oneShotConfig, and its switch; then validates them. done
// says the command ends there, with code.
func (e env) parseOneShot(name string, sw oneShotSwitch) (o oneShot, code int, done bool) {
	o.cfg = oneShotConfig()
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	slotFlags(fs, &o.cfg)
	fs.BoolVar(&o.on, sw.name, false, sw.usage)
	o.log.register(fs)
	if code, done := e.parseCommand(fs, name+" [flags]"); done {
		return o, code, true
	}
	fitSlots(fs, &o.cfg)
	if err := o.cfg.Validate(); err != nil {
		fmt.Fprintf(e.stderr, "phasegate %s: %s\n", name, oneLine(err))
		return o, exitUsage, true
	}
	return o, 0, false
}

// oneShotRefused says why one-shot command name was refused, when err is
// a refusal: a daemon holding the slots (exit 1, then hint), or the
// configuration (exit 2). done says the command ends there, with code.
func (e env) oneShotRefused(name string, err error, hint string) (code int, done bool) {
	var held *phases.SlotsHeldError
	switch {
	case errors.As(err, &held):
		fmt.Fprintf(e.stderr, "phasegate %s: %v; %s\n", name, err, hint)
		return exitFailed, true
	case errors.Is(err, phases.ErrConfig):
		fmt.Fprintf(e.stderr, "phasegate %s: %v\n", name, err)
		return exitUsage, true
	}
	return 0, false
}

// refuseIfHeld says, before anything is made, that a daemon holds cfg's
// lock (exit 1, naming it, then hint) or that the lock cannot be asked
// (exit 2); done says the command ends there, with code.
func (e env) refuseIfHeld(ctx context.Context, cmd string, cfg phases.Config, hint string) (code int, done bool) {
	lockPath, err := cfg.LockPath()
	if err != nil {
		fmt.Fprintf(e.stderr, "phasegate %s: %v\n", cmd, err)
		return exitUsage, true
	}
	held, pid, err := lockfile.Probe(ctx, lockPath)
	switch {
	case err != nil:
		fmt.Fprintf(e.stderr, "phasegate %s: %v\n", cmd, err)
		return exitUsage, true
	case held:
		fmt.Fprintf(e.stderr, "phasegate %s: %v%s\n", cmd, cfg.HeldError(&lockfile.HeldError{Path: lockPath, PID: pid}), hint)
		return exitFailed, true
	}
	return 0, false
}

// reclaimCmd tears down leaked slots once, without a daemon: for a host that
// will not run phasegate again, or to measure a reclaim. It takes the
// daemon's lock, so it refuses to run beside one.
func reclaimCmd(ctx context.Context, e env) int {
	o, code, done := e.parseOneShot("reclaim", oneShotSwitch{"dry-run", "list what would be reclaimed and change nothing"})
	if done {
		return code
	}
	cfg := o.cfg
	if code, done := e.refuseIfHeld(ctx, "reclaim", cfg, "; a daemon reclaims by itself"); done {
		return code
	}
	log := o.log.logger(e.stderr)
	if o.on {
		return reclaimDryRun(ctx, e, cfg)
	}
	summary, rep, err := phases.Reclaim(ctx, cfg, log)
	if code, done := e.oneShotRefused("reclaim", err, "a daemon reclaims by itself"); done {
		return code
	}
	switch {
	case err != nil && rep == nil:
		fmt.Fprintf(e.stderr, "phasegate reclaim: %v\n", err)
		return exitFailed
	}
	fmt.Fprintln(e.stdout, summary)
	fmt.Fprintln(e.stdout, rep.String())
	if err != nil || len(rep.Failed) > 0 || len(rep.Deferred) > 0 {
		return exitFailed
	}
	return exitOK
}

// reclaimDryRun lists the slots found and what a reclaim would do with
// each, without creating the netns directory, the firewall table or the
// state file, so it changes nothing on the host. A slot with a record is
// kept (a reclaim checks further that its objects are the recorded ones).
func reclaimDryRun(ctx context.Context, e env, cfg phases.Config) int {
	sr, err := slot.Survey(ctx, cfg.Slots)
	if err != nil {
		fmt.Fprintf(e.stderr, "phasegate reclaim: %v\n", err)
		return exitFailed
	}
	inv := sr.Inventory
	for _, u := range sr.Unreadable {
		fmt.Fprintf(e.stdout, "%d\t%s\tunreadable (%v): left alone\n", u.Index, u.Name, u.Err)
	}
	recorded := map[int]leases.State{}
	if _, err := os.Stat(cfg.StatePath()); err == nil {
		st, err := leases.Open(cfg.StatePath(), leases.Options{})
		if err != nil {
			fmt.Fprintf(e.stderr, "phasegate reclaim: %v\n", err)
			return exitFailed
		}
		recs, lerr := st.Load()
		_ = st.Close()
		if lerr != nil {
			fmt.Fprintf(e.stderr, "phasegate reclaim: %v\n", lerr)
			return exitFailed
		}
		for _, r := range recs {
			recorded[r.Index] = r.State
		}
	}
	leaked := 0
	for _, i := range inv.Indices() {
		what := "leaked: would be reclaimed"
		if st, ok := recorded[i]; ok {
			what = "recorded " + st.String() + ": kept"
		} else {
			leaked++
		}
		fmt.Fprintf(e.stdout, "%d\t%s\t%s\t%s\n", i, cfg.Slots.NetnsName(i), inv[i], what)
	}
	fmt.Fprintf(e.stdout, "%d leaked slots would be reclaimed, %d recorded ones kept\n", leaked, len(inv)-leaked)
	return exitOK
}
