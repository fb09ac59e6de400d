// Command bench measures how fast phasegate starts on a host with N leaked
// network slots, side by side in one run with two baselines:
//
//   - phasegate: the real binary (`phasegate serve`) is exec'd; the program
//     measures exec → first HTTP answer on /health (503 while starting),
//     exec → first gRPC health answer (NOT_SERVING) and exec → SERVING on a
//     grpc.health.v1 Watch stream, the reclaim report from the daemon's log
//     (slots/s) and the daemon's RSS once its warm pool is full;
//   - serial: the same binary with --serial-baseline, which starts the way
//     the seed report's orchestrator did (serial per-slot reclaim, then
//     storage and pool, and only then the port);
//   - floor: no daemon, the same leaked set removed by the bare minimum the
//     kernel needs (detach+unlink of the netns files with bounded workers,
//     then a wait until the host ends of the veth pairs are gone).
//
// For every N it leaks N slots (netns file + veth pair with an address on
// the host end + nftables set element) under a unique prefix in a temporary
// netns directory, runs each strategy on its own freshly leaked set, and
// repeats; it reports median and spread (min–max). A second part measures
// gRPC Check and HTTP /health latency from a separate load-generator process
// (this binary re-exec'd as `bench loadgen`) at a fixed rate, while the
// daemon reclaims and while it is idle.
//
// Output: a table on stdout, results.json, report.md and PNG plots in -out.
// With -doc FILE the section between the markers
// "<!-- bench:start -->" and "<!-- bench:end -->" of FILE is replaced by
// report.md. Timing goals are evaluated and reported, never asserted: the
// program exits non-zero only on real errors.
//
// It needs root. It touches nothing outside its own prefix and temporary
// directories, sends traffic only to 127.0.0.1, and removes everything it
// made on exit, on failure and on SIGINT/SIGTERM.
//
//	sudo go run ./test/bench -n 0,1000,5000,10000 -reps 3 -out docs/bench -doc docs/BENCHMARKS.md
//	sudo go run ./test/bench -n 0,200 -reps 1 -load-n 200 -out /tmp/bench   # smoke, < 2 min
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/phasegate/phasegate/network/slot"
)

// Exit codes.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "loadgen" {
		os.Exit(loadgenMain(os.Args[2:], os.Stderr))
	}
	os.Exit(benchMain(os.Args[1:], os.Stdout, os.Stderr))
}

// options are the benchmark's settings, from its flags.
type options struct {
	ns           []int
	reps         int
	serialReps   int
	serialMax    int
	loadN        int
	loadReps     int
	rate         int
	idleDuration time.Duration
	workers      int
	poolSize     int
	settle       time.Duration
	binary       string
	out          string
	doc          string
	breakdown    bool
	from         string
	cidr         string
	args         []string
}

// parseOptions parses the command line.
func parseOptions(args []string, stderr io.Writer) (options, error) {
	var (
		o       options
		nList   string
		skip10k bool
	)
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&nList, "n", "0,1000,5000,10000", "comma-separated numbers of leaked slots")
	fs.BoolVar(&skip10k, "skip-10k", false, "leave out N ≥ 10,000 (small machines); the report says so")
	fs.IntVar(&o.reps, "reps", 3, "repetitions of phasegate and floor at each N")
	fs.IntVar(&o.serialReps, "serial-reps", 1, "repetitions of the serial baseline at each N (it costs ~54 ms per slot)")
	fs.IntVar(&o.serialMax, "serial-max", 5000, "largest N at which the serial baseline is run; above it, it is reported as skipped with an extrapolation, marked as such")
	fs.IntVar(&o.loadN, "load-n", 5000, "leaked slots for the latency-under-reclaim measurement (0: skip it)")
	fs.IntVar(&o.loadReps, "load-reps", 0, "repetitions of the latency measurement (default: -reps)")
	fs.IntVar(&o.rate, "rate", 2000, "load generator requests per second, split evenly between gRPC Check and HTTP /health")
	fs.DurationVar(&o.idleDuration, "idle-duration", 3*time.Second, "length of the latency measurement against the idle daemon")
	fs.IntVar(&o.workers, "workers", slot.DefaultWorkers, "reclaim workers for phasegate (--reclaim-workers; default the daemon's) and the kernel floor")
	fs.IntVar(&o.poolSize, "pool-size", 16, "daemon --pool-size (warm slots; --pool-min-ready stays 1)")
	fs.DurationVar(&o.settle, "settle", 2*time.Second, "pause after each run so the kernel's namespace clean-up does not overlap the next")
	fs.StringVar(&o.binary, "binary", "", "phasegate binary to run (default: build ./cmd/phasegate without -race)")
	fs.StringVar(&o.out, "out", "docs/bench", "directory for results.json, report.md and the PNG plots")
	fs.StringVar(&o.doc, "doc", "", "Markdown file whose bench:start/bench:end section is replaced by report.md")
	fs.StringVar(&o.from, "from", "", "measure nothing: re-render the table, report, plots and -doc from this results.json")
	fs.BoolVar(&o.breakdown, "breakdown", true, "also run reclaim.Run in process once per N, for where its time goes")
	fs.StringVar(&o.cidr, "cidr", "169.254.0.0/17", "daemon --slot-cidr (must hold 2 × (max N + 64) addresses)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	ns, err := parseNs(nList, skip10k)
	if err != nil {
		return o, err
	}
	o.ns = ns
	if o.loadReps == 0 {
		o.loadReps = o.reps
	}
	switch {
	case o.reps < 1, o.serialReps < 0, o.loadReps < 1:
		return o, errors.New("-reps and -load-reps must be ≥ 1, -serial-reps ≥ 0")
	case o.rate < 2 || o.rate > 20000:
		return o, errors.New("-rate must be in [2, 20000]")
	case o.workers < 1, o.poolSize < 1:
		return o, errors.New("-workers and -pool-size must be ≥ 1")
	case o.loadN < 0:
		return o, errors.New("-load-n must be ≥ 0")
	}
	o.args = args
	return o, nil
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
	if o.from != "" {
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
	res, runErr := run(ctx, o, stderr)
	if res == nil {
		fmt.Fprintln(stderr, "bench:", runErr)
		return exitError
	}
	if runErr != nil {
		res.Notes = append(res.Notes, "INCOMPLETE: the run failed: "+oneLine(runErr))
		if o.doc != "" {
			fmt.Fprintf(stderr, "bench: %s left as it was: the run is incomplete\n", o.doc)
			o.doc = ""
		}
	}
	printTable(stdout, res)
	if err := writeOutputs(res, o); err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return exitError
	}
	fmt.Fprintf(stdout, "\nwrote %s\n", o.out)
	if runErr != nil {
		fmt.Fprintln(stderr, "bench:", runErr)
		return exitError
	}
	return exitOK
}

// render re-renders the outputs of an earlier run from its results.json.
func render(o options, stdout, stderr io.Writer) int {
	b, err := os.ReadFile(o.from)
	var res Results
	if err == nil {
		err = json.Unmarshal(b, &res)
	}
	if err == nil {
		printTable(stdout, &res)
		err = writeOutputs(&res, o)
	}
	if err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return exitError
	}
	return exitOK
}

// oneLine keeps the first line of an error (the rest is usually a log).
func oneLine(err error) string {
	s, _, _ := strings.Cut(err.Error(), "\n")
	return s
}
