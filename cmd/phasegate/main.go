// Command phasegate is the phasegate node daemon and its companion tools.
//
//	phasegate serve     run the daemon
//	phasegate status    show the phases of a running daemon
//	phasegate probe     exit 0 when a daemon serves (for scripts and exec checks)
//	phasegate slots     a client of the Slots API (acquire, release, keepalive, get, list)
//	phasegate held      the slots a daemon holds when its records were lost (list, adopt, release)
//	phasegate reclaim   one-shot clean-up of leaked slots, without a daemon
//	phasegate decommission  destroy every slot, leased ones included, and the records
//	phasegate demo      the whole story on this host, in one command (root)
//	phasegate version   print the version
//
// Exit codes: 0 success, 1 failure (startup failed, not serving), 2 usage or
// configuration error (nothing was created or touched).
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/phasegate/phasegate/app"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = "dev"

// Exit codes.
const (
	exitOK     = 0
	exitFailed = 1
	exitUsage  = 2
)

// env is what a command reads from its process: arguments, environment and
// output streams. Tests run commands in-process with their own env.
type env struct {
	args      []string
	lookupEnv func(string) (string, bool)
	stdout    io.Writer
	stderr    io.Writer
	isTTY     bool
	signals   <-chan os.Signal
	// configFiles are the configuration files an earlier image of this
	// process handed over across an in-place upgrade; serve reads its
	// policy and TLS files through it. Nil reads them from their paths.
	configFiles *app.ConfigFiles
}

func main() {
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	fi, _ := os.Stdout.Stat()
	e := env{
		args:      os.Args[1:],
		lookupEnv: os.LookupEnv,
		stdout:    os.Stdout,
		stderr:    os.Stderr,
		isTTY:     fi != nil && fi.Mode()&os.ModeCharDevice != 0,
		signals:   sigs,
		// Taken whatever the command, so that no child of it sees them.
		configFiles: app.InheritConfigFiles(),
	}
	os.Exit(run(context.Background(), e))
}

const usageText = `usage: phasegate <command> [flags]

commands:
  serve     run the daemon (binds its port at once, reclaims leaked slots, serves)
  status    show a daemon's phases: state, duration, progress (--watch to follow)
  events    a daemon's lifecycle events, one a line (--until-over to stop once the start is over)
  probe     exit 0 when a daemon serves, 1 when not, 2 when it cannot ask
  slots     lease, release, renew and list slots on a daemon (acquire, release, keepalive, get, list)
  held      slots a daemon keeps because its records were lost: list, adopt back as leases, release
  reclaim   one-shot reclaim of leaked slots (leased ones are kept); refuses while a daemon runs
  decommission  destroy every slot, leased ones too (--destroy-leased-slots), for a host leaving service
  demo      leak slots, start a daemon, watch it start and serve, clean up (root)
  version   print the version

Run "phasegate <command> --help" (or "phasegate help <command>") for a command's flags.
`

func run(ctx context.Context, e env) int {
	if len(e.args) == 0 {
		fmt.Fprint(e.stderr, usageText)
		return exitUsage
	}
	cmd, rest := e.args[0], e.args[1:]
	if cmd == "help" && len(rest) > 0 {
		// "phasegate help serve" is "phasegate serve --help".
		cmd, rest = rest[0], []string{"--help"}
	}
	e.args = rest
	if run, ok := commands()[cmd]; ok {
		return run(ctx, e)
	}
	switch cmd {
	case "version", "--version", "-version":
		if len(rest) > 0 && isHelp(rest[0]) {
			fmt.Fprint(e.stdout, "usage: phasegate version\n\nprints the version; no flags\n")
			return exitOK
		}
		fmt.Fprintf(e.stdout, "phasegate %s\n", version)
		return exitOK
	case "help", "-h", "--help":
		fmt.Fprint(e.stdout, usageText)
		return exitOK
	}
	fmt.Fprintf(e.stderr, "phasegate: unknown command %q\n\n%s", cmd, usageText)
	return exitUsage
}

// commands are the commands that take flags of their own, by name.
func commands() map[string]func(context.Context, env) int {
	return map[string]func(context.Context, env) int{
		"serve": serveCmd, "status": statusCmd, "events": eventsCmd, "probe": probeCmd,
		"reclaim": reclaimCmd, "decommission": decommissionCmd, "slots": slotsCmd, "held": heldCmd,
		"demo": demoCmd,
	}
}

// isHelp reports whether arg asks for help, in any spelling the flag
// package accepts (and the word itself).
func isHelp(arg string) bool {
	switch arg {
	case "-h", "-help", "--help", "--h", "help":
		return true
	}
	return false
}
