package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/phasegate/phasegate/phases"
)

// decommissionCmd destroys every slot of a configuration, leased ones
// included, with their records (the state file is removed) and the
// firewall table: for a host that leaves service. Its last line says what
// it removed and what it kept. A restart or an upgrade never does this; only this
// command does, and it refuses while slots are leased unless told
// --destroy-leased-slots.
func decommissionCmd(ctx context.Context, e env) int {
	o, code, done := e.parseOneShot("decommission", oneShotSwitch{"destroy-leased-slots",
		"also destroy leased slots, cutting their workloads off (required while any slot is leased)"})
	if done {
		return code
	}
	res, err := phases.Decommission(ctx, o.cfg, o.on, o.log.logger(e.stderr))
	if code, done := e.oneShotRefused("decommission", err, "stop it first"); done {
		return code
	}
	var leased *phases.LeasesExistError
	switch {
	case errors.As(err, &leased):
		fmt.Fprintf(e.stderr, "phasegate decommission: refused: %v\n", err)
		return exitFailed
	case err != nil:
		if res != nil {
			fmt.Fprintln(e.stdout, res.String())
		}
		fmt.Fprintf(e.stderr, "phasegate decommission: %v\n", err)
		return exitFailed
	}
	fmt.Fprintf(e.stdout, "decommissioned: %s\n", res.String())
	return exitOK
}
