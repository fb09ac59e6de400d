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
	"os/exec"
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
	var (
		mode    = flag.String("mode", "report", "report: the full network report; scan: old vs new scan at -sizes; batches: teardown in batches beside a workload")
		slots   = flag.Int("slots", 5000, "leaked slots per reclaim round, and slots managed by the pool (report, batches)")
		serialN = flag.Int("serial", 300, "leaked slots for the serial reference strategy")
		workers = flag.Int("workers", slot.DefaultWorkers, "detach+unlink workers (phasegate and floor)")
		rounds  = flag.Int("rounds", 2, "rounds of phasegate vs floor (interleaved)")
		creates = flag.Int("creates", 300, "sequential creates for the create latency")
		gets    = flag.Int("gets", 1000, "Get/Put cycles for the warm-pool Get latency (each Put resets the slot)")
		sizes   = flag.String("sizes", "1000,5000,10000", "scan: slot counts to scan at, ascending")
		reps    = flag.Int("reps", 5, "scan: scans of each kind per size; batches: rounds over -batches")
		batches = flag.String("batches", "0,1000,250,64", "batches: batch sizes to compare (0: all at once), each optionally with its own pause between batches, as 64+250ms")
		pause   = flag.Duration("pause", 0, "batches: pause between two batches where -batches gives none")
		out     = flag.String("out", "", "write the Markdown report here (default: stdout only)")
	)
	flag.Parse()
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "netbench: needs root")
		os.Exit(2)
	}
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, "netbench:", err)
		os.Exit(1)
	}
	var md string
	switch *mode {
	case "report":
		b, err := newBench(*slots + spare)
		if err != nil {
			fail(err)
		}
		defer b.sweep()
		r := &results{slots: *slots, serialN: *serialN, workers: *workers,
			cmd: fmt.Sprintf("cd test && go run ./netbench -slots %d -serial %d -workers %d -rounds %d -creates %d -gets %d -out ../docs/benchmarks/network.md",
				*slots, *serialN, *workers, *rounds, *creates, *gets)}
		if err := b.run(r, *serialN, *workers, *rounds, *creates, *gets); err != nil {
			b.sweep()
			fail(err)
		}
		md = r.markdown()
	case "scan":
		ns, err := ints(*sizes)
		if err != nil || len(ns) == 0 || !slices.IsSorted(ns) {
			fail(fmt.Errorf("-sizes %q: want ascending slot counts", *sizes))
		}
		b, err := newBench(ns[len(ns)-1])
		if err != nil {
			fail(err)
		}
		defer b.sweep()
		r := &results{cmd: fmt.Sprintf("cd test && go run ./netbench -mode scan -sizes %s -reps %d", *sizes, *reps)}
		r.machine()
		rows, err := b.scanBench(ns, *reps)
		r.loadEnd = loadavg()
		if err != nil {
			b.sweep()
			fail(err)
		}
		md = r.scanMarkdown(rows, *reps)
	case "batches":
		ks, err := batchSpecs(*batches, *pause)
		if err != nil || len(ks) == 0 {
			fail(fmt.Errorf("-batches %q: want batch sizes (%v)", *batches, err))
		}
		b, err := newBench(*slots)
		if err != nil {
			fail(err)
		}
		defer b.sweep()
		r := &results{cmd: fmt.Sprintf("cd test && go run ./netbench -mode batches -slots %d -batches %s -pause %v -reps %d",
			*slots, *batches, *pause, *reps)}
		r.machine()
		idle, rows, err := b.batchBench(*slots, ks, *reps)
		r.loadEnd = loadavg()
		if err != nil {
			b.sweep()
			fail(err)
		}
		md = r.batchMarkdown(*slots, idle, rows)
	default:
		fail(fmt.Errorf("unknown -mode %q", *mode))
	}
	fmt.Print(md)
	if *out != "" {
		if err := os.WriteFile(*out, []byte(md), 0o644); err != nil {
			fail(err)
		}
	}
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

type results struct {
	slots, serialN, workers int
	gets                    int
	cmd                     string

	kernel, cpu, goVersion string
	loadStart, loadEnd     string

	leakCreate           []time.Duration
	createP50, createP90 time.Duration
	createP99            time.Duration
	poolFill             time.Duration
	getP50, getP99       time.Duration
	getMax               time.Duration
	poolClose            time.Duration
	rssBase, rssManaged  int64
	heapManaged          uint64
	goroutines           int

	reports     []string
	phasegate   []time.Duration
	floorD      []time.Duration
	serialD     time.Duration
	batchedRest time.Duration // batched on the rest of the serial round
}

func pct(ds []time.Duration, p float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	k := int(float64(len(s)-1) * p)
	return s[k]
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:min(3, len(f))], " ")
}

func rss() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb * 1024
		}
	}
	return 0
}

// machine records the kernel, CPU, Go version and load at the start.
func (r *results) machine() {
	var u unix.Utsname
	_ = unix.Uname(&u)
	r.kernel = unix.ByteSliceToString(u.Release[:])
	r.cpu = fmt.Sprintf("%d CPUs", runtime.NumCPU())
	if out, err := exec.Command("sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2").Output(); err == nil {
		r.cpu += ", " + strings.TrimSpace(string(out))
	}
	r.goVersion = runtime.Version()
	r.loadStart = loadavg()
}

func (b *bench) run(r *results, serialN, workers, rounds, creates, gets int) error {
	ctx := context.Background()
	r.machine()
	defer func() { r.loadEnd = loadavg() }()
	runtime.GC()
	r.rssBase = rss()

	// 1. Sequential create latency.
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
	if err := b.settle(); err != nil {
		return err
	}

	// 2. A warm pool of N slots: fill, RSS, Get latency, Close.
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
	if err := b.settle(); err != nil {
		return err
	}

	// 3. Reclaim: phasegate vs the kernel floor, interleaved.
	for k := range rounds {
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
		if err := b.settle(); err != nil {
			return err
		}
	}

	// 4. Serial reference on a subset of a full population (N slots leaked,
	// the first serialN reclaimed serially with a count budget, so each
	// serial step works with as many mounts and links around as phasegate
	// had), then the rest with the batched strategy.
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

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }
func us(d time.Duration) string { return fmt.Sprintf("%.1f µs", float64(d.Nanoseconds())/1000) }

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func verdict(ok bool) string {
	if ok {
		return "**met**"
	}
	return "**missed**"
}

func (r *results) markdown() string {
	var b strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	pg, fl := median(r.phasegate), median(r.floorD)
	perPG := float64(pg.Microseconds()) / 1000 / float64(r.slots)
	perSerial := float64(r.serialD.Microseconds()) / 1000 / float64(r.serialN)
	perFloor := float64(fl.Microseconds()) / 1000 / float64(r.slots)
	ratioFloor := float64(pg) / float64(fl)
	speedup := perSerial / perPG

	w("# Network layer benchmarks\n\n")
	w("Measured by `test/netbench` on the real kernel, as root, in one run. Reproduce with:\n\n")
	w("```sh\n# as root, from the repository root\n%s\n```\n\n", r.cmd)
	w("Machine: Linux %s, %s, %s. Load average at start %s, at end %s. Numbers are wall times of single runs on a\n"+
		"2-core VM shared with other work: the kernel's namespace clean-up is one global worker, so anything else\n"+
		"creating or destroying namespaces on the host at the same time slows phasegate and the floor alike. Compare\n"+
		"the rows of one run, not runs on different days.\n\n",
		r.kernel, r.cpu, r.goVersion, r.loadStart, r.loadEnd)

	w("## Goals\n\n| goal | figure | verdict |\n|---|---|---|\n")
	w("| reclaim of %d leaked slots ≤ 1.5× the kernel floor | %s vs floor %s = %.2f× | %s |\n",
		r.slots, ms(pg), ms(fl), ratioFloor, verdict(ratioFloor <= 1.5))
	w("| reclaim ≥ 20× faster than the serial reference (per slot) | %.3f ms/slot vs %.2f ms/slot = %.0f× | %s |\n",
		perPG, perSerial, speedup, verdict(speedup >= 20))
	w("| pool Get from a warm pool p99 ≤ 100 µs | p99 %s (p50 %s, max %s, %d Gets) | %s |\n",
		us(r.getP99), us(r.getP50), us(r.getMax), r.gets, verdict(r.getP99 <= 100*time.Microsecond))
	w("| slot create median (reported) | median %s, p90 %s, p99 %s | reported |\n", ms(r.createP50), ms(r.createP90), ms(r.createP99))
	w("| RSS with %d slots managed (reported) | %.1f MiB (%.1f MiB before any slot; Go heap %.1f MiB; %d goroutine(s)) | reported |\n\n",
		r.slots, float64(r.rssManaged)/(1<<20), float64(r.rssBase)/(1<<20), float64(r.heapManaged)/(1<<20), r.goroutines)

	w("## Reclaim\n\n")
	w("Each round leaks %d slots (netns + veth pair + set element, made by `slot.Manager.Create` with 4 workers) and then tears them down.\n\n", r.slots)
	w("- **phasegate**: `reclaim.Run` with the batched strategy and %d workers, scan of the netns directory, links and set included: detach+unlink by the workers, wait for the host ends, one nftables transaction for all elements.\n", r.workers)
	w("- **kernel floor**: the same netns files, raw `umount2(MNT_DETACH)` + `unlink` with %d workers, then wait until every host end is gone (no scan, no firewall work).\n", r.workers)
	w("- **serial reference**: `serialteardown.Teardown` (test/internal/serialteardown), what E2B's orchestrator did per slot: delete the set element, delete the host veth with netlink, delete the netns. It costs tens of ms per slot, so it is measured on a **subset**: %d slots are leaked, the serial strategy reclaims the first %d (count budget; its scan is not counted) and the comparison is **per slot**; the batched strategy then reclaims the remaining %d.\n\n", r.slots, r.serialN, r.slots-r.serialN)
	w("| run | slots | wall time | per slot |\n|---|---|---|---|\n")
	for k := range r.phasegate {
		w("| phasegate, round %d | %d | %s | %.3f ms |\n", k+1, r.slots, ms(r.phasegate[k]), float64(r.phasegate[k].Microseconds())/1000/float64(r.slots))
		w("| kernel floor, round %d | %d | %s | %.3f ms |\n", k+1, r.slots, ms(r.floorD[k]), float64(r.floorD[k].Microseconds())/1000/float64(r.slots))
	}
	w("| phasegate, median | %d | %s | %.3f ms |\n", r.slots, ms(pg), perPG)
	w("| kernel floor, median | %d | %s | %.3f ms |\n", r.slots, ms(fl), perFloor)
	w("| serial reference | %d | %s | %.2f ms |\n", r.serialN, ms(r.serialD), perSerial)
	w("| phasegate, the rest of the serial round | %d | %s | %.3f ms |\n\n", r.slots-r.serialN, ms(r.batchedRest), float64(r.batchedRest.Microseconds())/1000/float64(r.slots-r.serialN))
	w("Extrapolated, the serial reference would need about %.0f s for %d slots.\n\n", perSerial*float64(r.slots)/1000, r.slots)
	w("phasegate's own reports (phases of each run):\n\n")
	for _, rep := range r.reports {
		w("- `%s`\n", rep)
	}
	w("\n")

	w("## Slots and pool\n\n| measure | value |\n|---|---|\n")
	w("| create one slot, sequential (netns, veth, addresses, routes, set element) | median %s, p90 %s, p99 %s |\n", ms(r.createP50), ms(r.createP90), ms(r.createP99))
	var leak time.Duration
	for _, d := range r.leakCreate {
		leak += d
	}
	if len(r.leakCreate) > 0 {
		leak /= time.Duration(len(r.leakCreate))
	}
	w("| create %d slots with 4 workers | %s (%.2f ms/slot) |\n", r.slots, ms(leak), float64(leak.Microseconds())/1000/float64(r.slots))
	w("| pool fill to %d warm slots, fill concurrency 4 | %s |\n", r.slots, ms(r.poolFill))
	w("| pool Get, warm pool (Get/Put cycles, Get timed) | p50 %s, p99 %s, max %s |\n", us(r.getP50), us(r.getP99), us(r.getMax))
	w("| pool Close with %d idle slots (batched teardown) | %s |\n", r.slots, ms(r.poolClose))
	w("| RSS of the process with %d slots managed | %.1f MiB (baseline %.1f MiB) |\n", r.slots, float64(r.rssManaged)/(1<<20), float64(r.rssBase)/(1<<20))
	return b.String()
}
