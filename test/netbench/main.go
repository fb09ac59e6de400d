// Command netbench measures phasegate's network layer on the real kernel and
// writes the results as Markdown. Its default mode writes
// docs/benchmarks/network.md:
//
//   - reclaim of N leaked slots (netns + veth + set element) with phasegate's
//     batched strategy, against the kernel floor (raw detach+unlink of the
//     same netns files with the same number of workers, then wait until the
//     host ends are gone) and against the serial reference strategy (run on a
//     smaller subset, compared per slot);
//   - slot create latency (median, p90, p99 of sequential creates);
//   - pool Get from a warm pool (p50, p99), pool fill and Close times;
//   - RSS with N slots managed by a warm pool.
//
// -mode scan times the scan of the previous design (per-entry lstat+statfs,
// an RTM_GETLINK dump) against slot.Manager.Survey at each of -sizes slots,
// made once and grown (docs/benchmarks/scan.md); -mode batches tears N
// leaked slots down with each of -batches batch sizes while a workload
// creates a slot every 250 ms and sends a loopback HTTP request every 10 ms
// (docs/benchmarks/batches.md).
//
// `netbench microvm` measures microVM slots beside their baselines: slot
// creation with and without the guest device, Acquire without a policy and
// with policies of 1 and 1,000 CIDRs, a policy replacement (microvm.go).
//
// It needs root, uses its own random prefix, a temporary netns directory
// and a link-local CIDR, and sweeps everything it made before it exits.
//
//	cd test && sudo go run ./netbench -slots 5000 -serial 300 -out ../docs/benchmarks/network.md
//	cd test && sudo go run ./netbench -mode scan -sizes 1000,5000,10000 -out ../docs/benchmarks/scan.md
//	cd test && sudo go run ./netbench -mode batches -slots 5000 -batches 0,1000,250,64 -out ../docs/benchmarks/batches.md
//	cd test && sudo go run ./netbench microvm -n 200
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/network/index"
	"github.com/phasegate/phasegate/network/pool"
	"github.com/phasegate/phasegate/network/reclaim"
	"github.com/phasegate/phasegate/network/slot"

	"github.com/phasegate/phasegate/test/internal/serialteardown"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "recycle" { // see recycle.go
		os.Exit(recycleMain(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == "microvm" { // see microvm.go
		os.Exit(microvmMain(os.Args[2:]))
	}
	f := parseFlags()
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "netbench: needs root")
		os.Exit(2)
	}
	md, err := f.measure()
	if err == nil {
		fmt.Print(md)
		if f.out != "" {
			err = os.WriteFile(f.out, []byte(md), 0o644)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "netbench:", err)
		os.Exit(1)
	}
}

// flags are netbench's command line.
type flags struct {
	mode                                     string
	slots, serialN, workers, rounds, creates int
	gets, reps                               int
	sizes, batches, out                      string
	pause                                    time.Duration
}

// parseFlags parses the command line.
func parseFlags() flags {
	var f flags
	flag.StringVar(&f.mode, "mode", "report", "report: the full network report; scan: old vs new scan at -sizes; batches: teardown in batches beside a workload")
	flag.IntVar(&f.slots, "slots", 5000, "leaked slots per reclaim round, and slots managed by the pool (report, batches)")
	flag.IntVar(&f.serialN, "serial", 300, "leaked slots for the serial reference strategy")
	flag.IntVar(&f.workers, "workers", slot.DefaultWorkers, "detach+unlink workers (phasegate and floor)")
	flag.IntVar(&f.rounds, "rounds", 2, "rounds of phasegate vs floor (interleaved)")
	flag.IntVar(&f.creates, "creates", 300, "sequential creates for the create latency")
	flag.IntVar(&f.gets, "gets", 1000, "Get/Put cycles for the warm-pool Get latency (each Put resets the slot)")
	flag.StringVar(&f.sizes, "sizes", "1000,5000,10000", "scan: slot counts to scan at, ascending")
	flag.IntVar(&f.reps, "reps", 5, "scan: scans of each kind per size; batches: rounds over -batches")
	flag.StringVar(&f.batches, "batches", "0,1000,250,64", "batches: batch sizes to compare (0: all at once), each optionally with its own pause between batches, as 64+250ms")
	flag.DurationVar(&f.pause, "pause", 0, "batches: pause between two batches where -batches gives none")
	flag.StringVar(&f.out, "out", "", "write the Markdown report here (default: stdout only)")
	flag.Parse()
	return f
}

// measure runs the mode's measurements and returns its Markdown report.
// What the bench leaked is swept when it returns.
func (f flags) measure() (string, error) {
	switch f.mode {
	case "report":
		b, err := newBench(f.slots + spare)
		if err != nil {
			return "", err
		}
		defer b.sweep()
		r := &results{slots: f.slots, serialN: f.serialN, workers: f.workers,
			cmd: fmt.Sprintf("cd test && go run ./netbench -slots %d -serial %d -workers %d -rounds %d -creates %d -gets %d -out ../docs/benchmarks/network.md",
				f.slots, f.serialN, f.workers, f.rounds, f.creates, f.gets)}
		if err := b.run(r, f.serialN, f.workers, f.rounds, f.creates, f.gets); err != nil {
			return "", err
		}
		return r.markdown(), nil
	case "scan":
		return f.measureScan()
	case "batches":
		return f.measureBatches()
	default:
		return "", fmt.Errorf("unknown -mode %q", f.mode)
	}
}

// measureScan compares the old and the new scan at each of -sizes.
func (f flags) measureScan() (string, error) {
	ns, err := ints(f.sizes)
	if err != nil || len(ns) == 0 || !slices.IsSorted(ns) {
		return "", fmt.Errorf("-sizes %q: want ascending slot counts", f.sizes)
	}
	b, err := newBench(ns[len(ns)-1])
	if err != nil {
		return "", err
	}
	defer b.sweep()
	r := &results{cmd: fmt.Sprintf("cd test && go run ./netbench -mode scan -sizes %s -reps %d", f.sizes, f.reps)}
	r.machine()
	rows, err := b.scanBench(ns, f.reps)
	r.loadEnd = loadavg()
	if err != nil {
		return "", err
	}
	return r.scanMarkdown(rows, f.reps), nil
}

// measureBatches compares teardowns in batches of each of -batches
// beside a workload.
func (f flags) measureBatches() (string, error) {
	ks, err := batchSpecs(f.batches, f.pause)
	if err != nil || len(ks) == 0 {
		return "", fmt.Errorf("-batches %q: want batch sizes (%v)", f.batches, err)
	}
	b, err := newBench(f.slots)
	if err != nil {
		return "", err
	}
	defer b.sweep()
	r := &results{cmd: fmt.Sprintf("cd test && go run ./netbench -mode batches -slots %d -batches %s -pause %v -reps %d",
		f.slots, f.batches, f.pause, f.reps)}
	r.machine()
	idle, rows, err := b.batchBench(f.slots, ks, f.reps)
	r.loadEnd = loadavg()
	if err != nil {
		return "", err
	}
	return r.batchMarkdown(f.slots, idle, rows), nil
}

// batchSpec is a batch size and the pause between two batches.
type batchSpec struct {
	k     int
	pause time.Duration
}

func batchSpecs(s string, pause time.Duration) ([]batchSpec, error) {
	var out []batchSpec
	for _, f := range strings.Split(s, ",") {
		k, p, ok := strings.Cut(strings.TrimSpace(f), "+")
		spec := batchSpec{pause: pause}
		v, err := strconv.Atoi(k)
		if err != nil || v < 0 {
			return nil, fmt.Errorf("%q is not a batch size", k)
		}
		spec.k = v
		if ok {
			if spec.pause, err = time.ParseDuration(p); err != nil {
				return nil, err
			}
		}
		out = append(out, spec)
	}
	return out, nil
}

func ints(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || v < 0 {
			return nil, fmt.Errorf("%q is not a count", f)
		}
		out = append(out, v)
	}
	return out, nil
}

// spare indices beyond the N managed slots, for the pool's refills while
// Gets are measured.
const spare = 64

type bench struct {
	cfg slot.Config
	dir string
	m   *slot.Manager
}

// newBench makes a manager for slots 1..n in a directory and prefix of the
// benchmark's own.
func newBench(n int) (*bench, error) {
	dir, err := os.MkdirTemp("", "netbench")
	if err != nil {
		return nil, err
	}
	cfg := slot.Config{
		Prefix:   randomPrefix("pb"),
		NetnsDir: dir,
		Slots:    n,
		CIDR:     netip.MustParsePrefix("169.254.0.0/17"),
	}
	m, err := slot.NewManager(context.Background(), cfg, slot.Options{})
	if err != nil {
		os.Remove(dir)
		return nil, err
	}
	return &bench{cfg: cfg, dir: dir, m: m}, nil
}

func (b *bench) sweep() {
	if err := sweep(b.cfg); err != nil {
		fmt.Fprintln(os.Stderr, "netbench: sweep:", err)
	}
	os.Remove(b.dir)
}

// leak makes slots 1..n with 4 workers and forgets them.
func (b *bench) leak(n int) (time.Duration, error) {
	start := time.Now()
	err := b.leakRange(1, n)
	return time.Since(start), err
}

// leakRange makes slots from..to with 4 workers and forgets them.
func (b *bench) leakRange(from, to int) error {
	ch := make(chan int)
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for range 4 {
		wg.Go(func() {
			for i := range ch {
				if _, err := b.m.Create(context.Background(), i); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		})
	}
	for i := from; i <= to; i++ {
		ch <- i
	}
	close(ch)
	wg.Wait()
	return errors.Join(errs...)
}

// settle waits until nothing of ours is left and the kernel's namespace
// clean-up has had a moment, so rounds do not overlap.
func (b *bench) settle() error {
	inv, err := b.m.Scan(context.Background())
	if err != nil {
		return err
	}
	if len(inv) != 0 {
		var some []string
		for _, i := range inv.Indices()[:min(5, len(inv))] {
			some = append(some, fmt.Sprintf("%d:%v", i, inv[i]))
		}
		return fmt.Errorf("%d slots left after a round: %v", len(inv), some)
	}
	time.Sleep(2 * time.Second)
	return nil
}

// floor is the kernel floor: raw umount2(MNT_DETACH)+unlink of every netns
// file with w workers, then wait until the host ends are gone. The set
// elements are left (removed after, untimed).
func (b *bench) floor(n, w int) (time.Duration, error) {
	names := make([]string, 0, n)
	type link struct {
		index int
		name  string
	}
	var links []link // resolved before the clock starts: the floor gets that for free
	for i := 1; i <= n; i++ {
		name := b.cfg.HostIfName(i)
		names = append(names, name)
		l, err := netlink.LinkByName(name)
		if err != nil {
			return 0, err
		}
		links = append(links, link{l.Attrs().Index, name})
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)

	start := time.Now()
	ents, err := os.ReadDir(b.dir)
	if err != nil {
		return 0, err
	}
	ch := make(chan string, len(ents))
	for _, e := range ents {
		ch <- filepath.Join(b.dir, e.Name())
	}
	close(ch)
	var wg sync.WaitGroup
	for range w {
		wg.Go(func() {
			for p := range ch {
				_ = unix.Unmount(p, unix.MNT_DETACH)
				_ = unix.Unlink(p)
			}
		})
	}
	wg.Wait()
	left := links
	delay := time.Millisecond
	for deadline := time.Now().Add(5 * time.Minute); len(left) > 0; {
		keep := left[:0]
		for _, l := range left {
			ifr, _ := unix.NewIfreq("")
			ifr.SetUint32(uint32(l.index))
			if unix.IoctlIfreq(fd, unix.SIOCGIFNAME, ifr) == nil && ifr.Name() == l.name {
				keep = append(keep, l)
			}
		}
		left = keep
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("floor: %d host ends still there", len(left))
		}
		time.Sleep(delay)
		delay = min(2*delay, 20*time.Millisecond)
	}
	d := time.Since(start)
	return d, b.m.Firewall().Remove(context.Background(), names...)
}

// run measures the network report: sequential creates, a warm pool of
// r.slots, reclaim beside the kernel's floor over rounds, and the serial
// reference on serialN slots.
func (b *bench) run(r *results, serialN, workers, rounds, creates, gets int) error {
	ctx := context.Background()
	r.machine()
	defer func() { r.loadEnd = loadavg() }()
	runtime.GC()
	r.rssBase = rss()
	if err := b.measureCreates(ctx, r, creates); err != nil {
		return err
	}
	if err := b.measurePool(ctx, r, gets); err != nil {
		return err
	}
	for k := range rounds {
		if err := b.measureReclaimRound(ctx, r, k, workers); err != nil {
			return err
		}
	}
	return b.measureSerial(ctx, r, serialN, workers)
}

// measureCreates measures the latency of creates sequential creates,
// then tears the slots down.
func (b *bench) measureCreates(ctx context.Context, r *results, creates int) error {
	fmt.Fprintln(os.Stderr, "create latency...")
	var lat []time.Duration
	for i := 1; i <= creates; i++ {
		t0 := time.Now()
		if _, err := b.m.Create(ctx, i); err != nil {
			return err
		}
		lat = append(lat, time.Since(t0))
	}
	r.createP50, r.createP90, r.createP99 = pct(lat, 0.5), pct(lat, 0.9), pct(lat, 0.99)
	idx := make([]int, creates)
	for k := range idx {
		idx[k] = k + 1
	}
	if res := b.m.Teardown(ctx, slot.Assume(idx...), slot.TeardownOptions{}); res.Err() != nil {
		return res.Err()
	}
	return b.settle()
}

// measurePool fills a warm pool of r.slots and measures the fill, the
// memory it holds, gets Get/Put cycles and its Close.
func (b *bench) measurePool(ctx context.Context, r *results, gets int) error {
	fmt.Fprintln(os.Stderr, "pool...", time.Now().Format(time.TimeOnly))
	st, err := index.New(r.slots+spare, nil)
	if err != nil {
		return err
	}
	t0 := time.Now()
	p, err := pool.New(b.m, st, pool.Options{Target: r.slots, FillConcurrency: 4})
	if err != nil {
		return err
	}
	if err := p.WaitReady(ctx, r.slots); err != nil {
		return err
	}
	r.poolFill = time.Since(t0)
	fmt.Fprintln(os.Stderr, "pool filled", r.poolFill)
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	r.rssManaged, r.heapManaged, r.goroutines = rss(), ms.HeapAlloc, runtime.NumGoroutine()
	var gl []time.Duration
	for range gets {
		t := time.Now()
		s, err := p.Get(ctx)
		d := time.Since(t)
		if err != nil {
			return err
		}
		gl = append(gl, d)
		if err := p.Put(ctx, s); err != nil {
			return err
		}
	}
	fmt.Fprintln(os.Stderr, "gets done", time.Now().Format(time.TimeOnly))
	r.getP50, r.getP99, r.getMax, r.gets = pct(gl, 0.5), pct(gl, 0.99), pct(gl, 1), len(gl)
	t0 = time.Now()
	if err := p.Close(ctx); err != nil {
		return err
	}
	r.poolClose = time.Since(t0)
	fmt.Fprintln(os.Stderr, "pool closed", r.poolClose)
	return b.settle()
}

// measureReclaimRound is round k of phasegate's reclaim beside the kernel
// floor: r.slots leaked and reclaimed by each, interleaved.
func (b *bench) measureReclaimRound(ctx context.Context, r *results, k, workers int) error {
	fmt.Fprintf(os.Stderr, "round %d: leak %d...\n", k+1, r.slots)
	d, err := b.leak(r.slots)
	if err != nil {
		return err
	}
	r.leakCreate = append(r.leakCreate, d)
	time.Sleep(2 * time.Second)
	rep, err := reclaim.Run(ctx, b.m, reclaim.Options{Workers: workers})
	if err != nil {
		return err
	}
	if rep.Found != r.slots || len(rep.Reclaimed) != r.slots {
		return fmt.Errorf("phasegate reclaim: %v", rep)
	}
	fmt.Fprintln(os.Stderr, " ", rep)
	r.reports = append(r.reports, rep.String())
	r.phasegate = append(r.phasegate, rep.Duration)
	if err := b.settle(); err != nil {
		return err
	}

	fmt.Fprintf(os.Stderr, "round %d: leak %d for the floor...\n", k+1, r.slots)
	if d, err = b.leak(r.slots); err != nil {
		return err
	}
	r.leakCreate = append(r.leakCreate, d)
	time.Sleep(2 * time.Second)
	fd, err := b.floor(r.slots, workers)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "  floor: %v\n", fd)
	r.floorD = append(r.floorD, fd)
	return b.settle()
}

// measureSerial is the serial reference on a subset of a full
// population (N slots leaked, the first serialN reclaimed serially with a
// count budget, so each serial step works with as many mounts and links
// around as phasegate had), then the rest with the batched strategy.
func (b *bench) measureSerial(ctx context.Context, r *results, serialN, workers int) error {
	fmt.Fprintf(os.Stderr, "serial: leak %d, reclaim %d serially...\n", r.slots, serialN)
	if _, err := b.leak(r.slots); err != nil {
		return err
	}
	time.Sleep(2 * time.Second)
	inv, err := b.m.Scan(ctx) // the scan is not counted: the comparison is per slot torn down
	if err != nil {
		return fmt.Errorf("serial: scan: %w", err)
	}
	began := time.Now()
	res := serialteardown.Teardown(ctx, b.m, inv, serialN, nil)
	r.serialD = time.Since(began)
	if len(res.Reclaimed) != serialN || len(res.Failed) > 0 {
		return fmt.Errorf("serial: reclaimed %d of %d, failed %v", len(res.Reclaimed), serialN, res.Failed)
	}
	fmt.Fprintf(os.Stderr, "  serial: reclaimed %d in %v\n", len(res.Reclaimed), r.serialD.Round(time.Millisecond))
	rep, err := reclaim.Run(ctx, b.m, reclaim.Options{Workers: workers})
	if err != nil || len(rep.Reclaimed) != r.slots-serialN {
		return fmt.Errorf("batched rest: %v, %v", rep, err)
	}
	fmt.Fprintln(os.Stderr, " ", rep)
	r.batchedRest = rep.Duration
	return b.settle()
}
