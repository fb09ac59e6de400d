package main

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// results are what the report mode measured, and the machine it ran on.
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

// pct is the p-quantile of ds.
func pct(ds []time.Duration, p float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	k := int(float64(len(s)-1) * p)
	return s[k]
}

// loadavg is the machine's load averages as /proc/loadavg shows them.
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:min(3, len(f))], " ")
}

// rss is this process's resident set size in bytes.
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

// ms formats d in milliseconds.
func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }

// us formats d in microseconds.
func us(d time.Duration) string { return fmt.Sprintf("%.1f µs", float64(d.Nanoseconds())/1000) }

// median is the median of ds.
func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// verdict is a goal's mark: met or not.
func verdict(ok bool) string {
	if ok {
		return "**met**"
	}
	return "**missed**"
}

// markdown renders the report mode's results.
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
