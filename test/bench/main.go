// Command bench measures how fast phasegate starts and restarts, and what
// its clients see meanwhile, each figure beside its baseline in the same
// run. Its parts (-parts):
//
//   - dead: a host with N dead slots (leaked by a killed run, unrecorded).
//     The daemon is exec'd with the default --reclaim=background (dead slots
//     torn down after SERVING), with --reclaim=foreground (before the warm
//     slots: the start of every release before live restore); the serial
//     baseline is ./serialbaseline, a program of this module (the E2B
//     orchestrator's start on the library's parts: serial reclaim, port
//     bound last); the kernel floor is the same set removed by the bare
//     minimum the kernel needs, no daemon. Measured: exec → first HTTP
//     answer, first gRPC health answer, SERVING (Watch stream), and exec →
//     the dead all gone (the daemon's reclaim report).
//   - restore: N slots leased through the API, then the daemon stopped
//     (SIGTERM) or killed (kill -9) and started again: exec → SERVING, and
//     N/N leases restored with the kernel identity of every leased
//     namespace and veth unchanged (0 destroyed). With -restore-guest (the
//     default), each N is then measured again with the microVM guest
//     profile (--slot-guest-*) and an egress policy on every lease, and
//     after each restart every lease's policy is checked in List and a
//     sample of namespaces with nft and ip.
//   - load: health checks (gRPC Check and HTTP /health) from a separate
//     load-generator process, at -rate on kept connections with Acquire
//     calls from another, and at checker rates as real checkers send them
//     (HTTP on a new connection each), while the daemon reclaims dead
//     slots in the background, and against an idle daemon; a control server (`bench
//     control`: net/http and grpc-go's health server, no phasegate) is
//     probed the same way in the same seconds, the baseline of every
//     health figure.
//   - acquire: Acquire throughput and latency over gRPC on a Unix socket
//     with the durable lease record (the daemon, on its control socket)
//     beside the same service over the same pool with the record kept in a
//     map (`bench memslots`).
//   - slotrate: slots made beyond the warm pool: Acquire bursts from 1 and
//     16 callers against a daemon with --pool-size 1, beside the library
//     making the same number of slots alone (slot.Manager.Create, no
//     daemon), in the same run.
//   - upgrade: new connections at a fixed rate (HTTP /health and gRPC Check,
//     a new TCP connection each) across SIGHUP in-place upgrades, and across
//     SIGTERM + start pairs with the port closed between them and with the
//     socket held (systemd socket activation).
//   - flood: health checks (a new connection each) and the owner's Acquire
//     on the control socket while nobody floods the port with as many gRPC
//     connections as it can get (`bench flood`, run under runuser), beside
//     a quiet window of the same length on the same daemon.
//   - ab (run only when named): two builds side by side, -ab-binary (A,
//     the baseline) and -binary (B), started in turn in the same minutes:
//     exec → first answer and SERVING, then health checks on a new TCP
//     connection each at -ab-rates, plain and over TLS; without
//     -ab-binary, the build beside itself (the noise of the machine).
//   - decom (run only when named): `phasegate decommission
//     --destroy-leased-slots` of N leased slots beside the kernel floor for
//     the same namespaces and links, and with -ab-binary that build's.
//   - first (run only when named): exec → the first /health answer of
//     phasegate at each N of dead slots up to 5,000, beside a trivial Go
//     HTTP server the benchmark builds, and each one's package inits.
//
// Output: a table on stdout, report.md and PNG plots in -out, and the raw
// figures, results.json, in -results (a cache outside the repository,
// /var/cache/phasegate/bench by default: raw data is not committed). With
// -doc FILE the section between the markers "<!-- bench:start -->" and
// "<!-- bench:end -->" of FILE is replaced by report.md, and with -headline
// FILE (the README) the section between "<!-- headline:start -->" and
// "<!-- headline:end -->" by the headline table. With -merge, the
// parts not run are kept from -results/results.json, so that one part can
// be measured again; -from measures nothing and re-renders the outputs from
// it. Timing goals are evaluated and reported, never asserted: the program
// exits non-zero only on real errors.
//
// It needs root. It touches nothing outside its own prefix and temporary
// directories, sends traffic only to 127.0.0.1, and removes everything it
// made on exit, on failure and on SIGINT/SIGTERM.
//
//	cd test && sudo go run ./bench -out ../docs/bench -doc ../docs/BENCHMARKS.md -headline ../README.md
//	cd test && sudo go run ./bench -parts load -merge -out ../docs/bench -doc ../docs/BENCHMARKS.md -headline ../README.md
//	cd test && sudo go run ./bench -from -out ../docs/bench -doc ../docs/BENCHMARKS.md -headline ../README.md   # re-render
//	cd test && sudo go run ./bench -n 0,200 -reps 1 -load-n 200 -load-reps 1 -flood-duration 2s -out /tmp/bench -results /tmp/bench   # smoke, < 2 min
//	cd test && sudo go run ./bench -parts ab -binary /tmp/phasegate-new -ab-binary /tmp/phasegate-old -out /tmp/ab -results /tmp/ab
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/phasegate/phasegate/network/slot"
	"github.com/phasegate/phasegate/test/internal/portflood"
)

// Exit codes.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

func main() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "loadgen":
			os.Exit(loadgenMain(os.Args[2:], os.Stderr))
		case "memslots":
			os.Exit(memslotsMain(os.Args[2:], os.Stderr))
		case "control":
			os.Exit(controlMain(os.Args[2:], os.Stderr))
		case "flood":
			os.Exit(portflood.Run(strings.Join(os.Args[2:], " "), os.Stdout, os.Stderr))
		case "sink":
			os.Exit(sinkMain(os.Args[2:], os.Stderr))
		}
	}
	os.Exit(benchMain(os.Args[1:], os.Stdout, os.Stderr))
}

// Parts of the benchmark, in the order they run.
const (
	partDead     = "dead"
	partRestore  = "restore"
	partLoad     = "load"
	partAcquire  = "acquire"
	partUpgrade  = "upgrade"
	partSlotRate = "slotrate"
	partFlood    = "flood"
	partCNI      = "cni"
	partAB       = "ab"
	partDecom    = "decom"
	partFirst    = "first"
)

var allParts = []string{partDead, partRestore, partLoad, partAcquire, partSlotRate, partUpgrade, partFlood, partCNI, partAB, partDecom, partFirst}

// defaultParts run without -parts: all but ab, a comparison of two builds
// asked for by name.
var defaultParts = slices.DeleteFunc(slices.Clone(allParts), func(p string) bool { return p == partAB || p == partDecom || p == partFirst })

// options are the benchmark's settings, from its flags.
type options struct {
	parts        []string
	merge        bool
	ns           []int
	reps         int
	serialReps   int
	serialMax    int
	leaseClients int
	restoreGuest bool
	// restoreDatapath: part restore measures the ports+limits variant.
	restoreDatapath bool
	guestAddr       netip.Prefix
	loadN           int
	loadReps        int
	rate            int
	acquireRate     int
	idleDuration    time.Duration
	acquireN        int
	acquireConc     int
	slotRateN       int
	upgrades        int
	restarts        int
	probeRate       int
	upLeases        int
	floodDuration   time.Duration
	floodConns      int
	cniCalls        int
	cniGC           int
	cniPodman       int
	ab              abOptions
	workers         int
	poolSize        int
	settle          time.Duration
	binary          string
	out             string
	doc             string
	headline        string
	breakdown       bool
	from            bool
	results         string
	cidr            string
	stateParent     string
	args            []string
}

// defaultResultsDir is where results.json is kept: raw figures are cached
// outside the repository, which holds only what is rendered from them.
const defaultResultsDir = "/var/cache/phasegate/bench"

// resultsFile is the raw figures' file.
func (o options) resultsFile() string { return filepath.Join(o.results, "results.json") }

// has reports whether part is to be run.
func (o options) has(part string) bool { return slices.Contains(o.parts, part) }

// parseOptions parses the command line.
func parseOptions(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	raw := o.register(fs)
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if err := o.resolve(raw); err != nil {
		return o, err
	}
	if err := o.validate(); err != nil {
		return o, err
	}
	o.args = args
	return o, nil
}

// rawFlags are the flags parsed into something other than an options
// field: lists and addresses that resolve reads.
type rawFlags struct {
	nList, parts, guestAddr string
	skip10k                 bool
	abRates, abTLSRates     *string
}

// register defines the benchmark's flags on fs, into o and the returned
// rawFlags.
func (o *options) register(fs *flag.FlagSet) *rawFlags {
	raw := new(rawFlags)
	fs.StringVar(&raw.parts, "parts", strings.Join(defaultParts, ","), "parts to run: "+strings.Join(allParts, ", ")+" (ab, decom and first only when named)")
	fs.BoolVar(&o.merge, "merge", false, "keep the parts not run from -results/results.json (to measure one part again)")
	fs.StringVar(&raw.nList, "n", "0,1000,5000,10000", "comma-separated numbers of dead slots (part dead) and of leased slots (part restore)")
	fs.BoolVar(&raw.skip10k, "skip-10k", false, "leave out N ≥ 10,000 (small machines); the report says so")
	fs.IntVar(&o.reps, "reps", 3, "repetitions at each N: of each dead-slot strategy, and of each kind of restart")
	fs.IntVar(&o.serialReps, "serial-reps", 1, "repetitions of the serial baseline at each N (it costs ~35-55 ms per slot)")
	fs.IntVar(&o.serialMax, "serial-max", 1000, "largest N at which the serial baseline is run; above it, it is reported as skipped with an extrapolation, marked as such")
	fs.IntVar(&o.leaseClients, "lease-clients", 32, "concurrent Acquire calls that lease the N slots of the restore part")
	fs.BoolVar(&o.restoreGuest, "restore-guest", true, "part restore: also measure each N with the microVM guest profile (--slot-guest-*) and an egress policy on every lease")
	fs.BoolVar(&o.restoreDatapath, "restore-datapath", false, "part restore: also measure each N with a published port and bandwidth limits on every lease")
	fs.StringVar(&raw.guestAddr, "guest-addr", "169.254.255.21/30", "part restore: the guest profile's --slot-guest-addr (the tap, --slot-guest-gateway, is the next address); outside -cidr and the host's routes")
	fs.IntVar(&o.loadN, "load-n", goalLoadN, "dead slots reclaimed in the background while the load runs (0: skip the load part)")
	fs.IntVar(&o.loadReps, "load-reps", 0, "repetitions of the load part (default: -reps)")
	fs.IntVar(&o.rate, "rate", 2000, "health checks per second from the load generator, half gRPC Check, half HTTP /health")
	fs.IntVar(&o.acquireRate, "acquire-rate", 10, "Acquire calls per second from a second load generator during the load part (0: none)")
	fs.DurationVar(&o.idleDuration, "idle-duration", 3*time.Second, "length of the load against the idle daemon")
	fs.IntVar(&o.acquireN, "acquire-n", -1, "Acquire calls per repetition of the throughput part, each from a warm pool of that size (default: the largest -n, within [100, 1000]; 0: skip the part)")
	fs.IntVar(&o.acquireConc, "acquire-clients", 16, "concurrent callers of the throughput part, over one connection")
	fs.IntVar(&o.slotRateN, "slotrate-n", 300, "slots made per run of the slotrate part: by the library alone, and by Acquires beyond a warm pool of one (0: skip the part)")
	fs.IntVar(&o.upgrades, "upgrades", 20, "SIGHUP in-place upgrades in a row (0: skip the upgrade part)")
	fs.IntVar(&o.restarts, "restarts", 3, "SIGTERM + start pairs, with the port closed and with the socket held")
	fs.IntVar(&o.probeRate, "probe-rate", 500, "new connections per second across upgrades and restarts, half HTTP /health, half gRPC Check")
	fs.IntVar(&o.upLeases, "upgrade-leases", 64, "slots leased before the upgrades, checked after each")
	fs.DurationVar(&o.floodDuration, "flood-duration", 10*time.Second, "part flood: the length of each window, quiet and flooded (0: skip the part)")
	fs.IntVar(&o.floodConns, "flood-conns", 2000, "part flood: the gRPC connections nobody tops up to each second (a Check each, held)")
	fs.IntVar(&o.cniCalls, "cni-calls", 200, "part cni: ADDs, then DELs, per plugin and number of callers in each rep (0: skip the part)")
	fs.IntVar(&o.cniGC, "cni-gc", 1000, "part cni: attachments a runtime forgot, ended by one GC, against the kernel floor")
	fs.IntVar(&o.cniPodman, "cni-podman", 10, "part cni: `podman run` on each network in each rep (0: none)")
	raw.abRates, raw.abTLSRates = o.ab.register(fs)
	fs.IntVar(&o.workers, "workers", slot.DefaultWorkers, "reclaim workers for phasegate (--reclaim-workers; default the daemon's) and the kernel floor")
	fs.IntVar(&o.poolSize, "pool-size", 16, "daemon --pool-size (warm slots; --pool-min-ready stays 1)")
	fs.DurationVar(&o.settle, "settle", 2*time.Second, "pause after each run so the kernel's namespace clean-up does not overlap the next")
	fs.StringVar(&o.binary, "binary", "", "phasegate binary to run (default: build ./cmd/phasegate without -race)")
	fs.StringVar(&o.out, "out", "docs/bench", "directory for report.md and the PNG plots")
	fs.StringVar(&o.results, "results", defaultResultsDir, "directory for results.json, the raw figures (a cache outside the repository)")
	fs.StringVar(&o.doc, "doc", "", "Markdown file whose bench:start/bench:end section is replaced by report.md")
	fs.StringVar(&o.headline, "headline", "", "Markdown file (the README) whose headline:start/headline:end section is replaced by the headline table")
	fs.BoolVar(&o.from, "from", false, "measure nothing: re-render the table, report, plots and -doc from -results/results.json")
	fs.BoolVar(&o.breakdown, "breakdown", false, "also run reclaim.Run in process once per N, for where its time goes")
	fs.StringVar(&o.cidr, "cidr", "169.254.0.0/17", "daemon --slot-cidr (must hold 2 × (max N + 512) addresses)")
	fs.StringVar(&o.stateParent, "state-parent", "/dev/shm", "where the daemon's temporary --state-dir is made (tmpfs, as /run is under systemd)")
	return raw
}

// resolve parses raw into o, fills the defaults that depend on other
// flags and drops the parts whose size is zero.
func (o *options) resolve(raw *rawFlags) error {
	ns, err := parseNs(raw.nList, raw.skip10k)
	if err != nil {
		return err
	}
	o.ns = ns
	if o.parts, err = parseParts(raw.parts); err != nil {
		return err
	}
	if err := o.ab.parse(*raw.abRates, *raw.abTLSRates); err != nil {
		return err
	}
	if o.guestAddr, err = netip.ParsePrefix(raw.guestAddr); err != nil {
		return fmt.Errorf("-guest-addr: %w", err)
	}
	if o.restoreGuest && o.has(partRestore) {
		if err := validGuestAddr(o.guestAddr, o.cidr); err != nil {
			return err
		}
	}
	if o.loadReps == 0 {
		o.loadReps = o.reps
	}
	if o.acquireN < 0 {
		o.acquireN = min(max(slices.Max(ns), 100), 1000)
	}
	// A size of zero skips its part.
	for _, z := range []struct {
		zero bool
		part string
	}{
		{o.loadN == 0, partLoad},
		{o.acquireN == 0, partAcquire},
		{o.slotRateN == 0, partSlotRate},
		{o.upgrades == 0, partUpgrade},
		{o.floodDuration == 0, partFlood},
		{o.cniCalls == 0, partCNI},
	} {
		if z.zero {
			o.parts = slices.DeleteFunc(o.parts, func(p string) bool { return p == z.part })
		}
	}
	return nil
}

// validate checks that every size and rate is within its bounds.
func (o *options) validate() error {
	switch {
	case o.reps < 1, o.serialReps < 0, o.loadReps < 1:
		return errors.New("-reps and -load-reps must be ≥ 1, -serial-reps ≥ 0")
	case o.rate < 2 || o.rate > 20000, o.probeRate < 2 || o.probeRate > 5000, o.acquireRate < 0 || o.acquireRate > 1000:
		return errors.New("-rate must be in [2, 20000], -probe-rate in [2, 5000], -acquire-rate in [0, 1000]")
	case o.workers < 1, o.poolSize < 1, o.leaseClients < 1, o.acquireConc < 1:
		return errors.New("-workers, -pool-size, -lease-clients and -acquire-clients must be ≥ 1")
	case o.loadN < 0 || o.loadN > maxSlots, o.acquireN > maxSlots/2, o.upLeases < 0 || o.upLeases > maxSlots:
		return fmt.Errorf("-load-n and -upgrade-leases must be in [0, %d], -acquire-n at most %d", maxSlots, maxSlots/2)
	case o.upgrades < 0, o.restarts < 0:
		return errors.New("-upgrades and -restarts must be ≥ 0")
	case o.floodDuration < 0 || o.floodDuration%time.Second != 0, o.floodConns < 1:
		return errors.New("-flood-duration must be whole seconds ≥ 0, -flood-conns ≥ 1")
	case o.cniCalls < 0 || o.cniCalls > maxSlots/2, o.cniGC < 1 || o.cniGC > maxSlots/2, o.cniPodman < 0:
		return fmt.Errorf("-cni-calls must be in [0, %d], -cni-gc in [1, %d], -cni-podman ≥ 0", maxSlots/2, maxSlots/2)
	}
	return nil
}

// parseParts parses "dead,load" into parts in their running order.
func parseParts(s string) ([]string, error) {
	var out []string
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		if !slices.Contains(allParts, f) {
			return nil, fmt.Errorf("-parts: %q is not one of %s", f, strings.Join(allParts, ", "))
		}
		out = append(out, f)
	}
	return slices.DeleteFunc(slices.Clone(allParts), func(p string) bool { return !slices.Contains(out, p) }), nil
}

// parseNs parses "0,1000,5000" into sorted, distinct counts.
func parseNs(s string, skip10k bool) ([]int, error) {
	seen := map[int]bool{}
	var ns []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 || n > maxSlots {
			return nil, fmt.Errorf("-n: %q is not a count in [0, %d]", f, maxSlots)
		}
		if (skip10k && n >= 10000) || seen[n] {
			continue
		}
		seen[n] = true
		ns = append(ns, n)
	}
	if len(ns) == 0 {
		return nil, errors.New("-n: no counts left")
	}
	slices.Sort(ns)
	return ns, nil
}

// benchMain runs the benchmark and returns the exit code.
func benchMain(args []string, stdout, stderr io.Writer) int {
	o, err := parseOptions(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return exitUsage
	}
	if o.from {
		return render(o, stdout, stderr)
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(stderr, "bench: needs root (network namespaces, veth, nftables)")
		return exitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	// After the first signal, the default disposition is back: a second
	// one kills at once.
	context.AfterFunc(ctx, stop)
	var prev *Results
	if o.merge {
		if prev, err = readResults(o.resultsFile()); err != nil {
			fmt.Fprintln(stderr, "bench: -merge:", err)
			return exitUsage
		}
	}
	res, runErr := run(ctx, o, prev, stderr)
	if res == nil {
		fmt.Fprintln(stderr, "bench:", runErr)
		return exitError
	}
	if runErr != nil {
		for _, f := range []*string{&o.doc, &o.headline} {
			if *f != "" {
				fmt.Fprintf(stderr, "bench: %s left as it was: the run is incomplete\n", *f)
				*f = ""
			}
		}
	}
	printTable(stdout, res)
	if err := writeOutputs(res, o); err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return exitError
	}
	fmt.Fprintf(stdout, "\nwrote %s and %s\n", o.out, o.resultsFile())
	if runErr != nil {
		fmt.Fprintln(stderr, "bench:", runErr)
		return exitError
	}
	return exitOK
}

// render re-renders the outputs of an earlier run from its results.json.
func render(o options, stdout, stderr io.Writer) int {
	res, err := readResults(o.resultsFile())
	if err == nil {
		res.evaluate()
		printTable(stdout, res)
		err = writeOutputs(res, o)
	}
	if err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return exitError
	}
	return exitOK
}

// readResults reads a results.json.
func readResults(file string) (*Results, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var res Results
	if err := json.Unmarshal(b, &res); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return &res, nil
}

// oneLine keeps the first line of an error (the rest is usually a log).
func oneLine(err error) string {
	s, _, _ := strings.Cut(err.Error(), "\n")
	return s
}
