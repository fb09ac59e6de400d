package test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/phasegate/phasegate/phasetest/proc"
)

// loadSample is what test/bench's load generator records per request.
type loadSample struct {
	Kind    string `json:"k"`
	Latency int64  `json:"lat"`
	Err     string `json:"err"`
	At      int64  `json:"at"` // when it was sent, Unix ns
}

// TestHealthUnderLoadWhileReclaiming has a separate process send health
// checks (gRPC and HTTP alternately, open loop, fixed rate) from the first
// moment the port answers, through a reclaim of leaked slots, into serving:
// not one may fail, and the daemon's descriptors, goroutines and memory
// must be back where they were once the load stops.
//
// The CI variant runs 2,000 checks/s for 15 s over 1,000 leaked slots; with
// PHASEGATE_LOAD_LONG=1 it is the 5,000 checks/s for 60 s over 5,000.
func TestHealthUnderLoadWhileReclaiming(t *testing.T) {
	leaked, rate, duration, report, rest := 1000, 2000, 15*time.Second, "load.txt", 15*time.Second
	if os.Getenv("PHASEGATE_LOAD_LONG") == "1" {
		leaked, rate, duration, report, rest = 5000, 5000, 60*time.Second, "load-long.txt", time.Minute
	}
	// Both sides are built without the race detector: this measures a
	// daemon as it runs in production.
	dir := t.TempDir()
	daemonBin, loadBin := filepath.Join(dir, "phasegate"), filepath.Join(dir, "bench")
	run(t, "go", "build", "-o", daemonBin, "github.com/phasegate/phasegate/cmd/phasegate")
	run(t, "go", "build", "-o", loadBin, "./bench")

	h := newHost(t)
	h.leak(h.prefix, 1, leaked)
	// Making thousands of namespaces leaves the kernel seconds of
	// asynchronous clean-up (RCU callbacks, freeing); let it end so that the
	// figures are the daemon's, not the fixture's.
	t.Logf("waited %v for the host to come to rest", waitHostIdle(t, 0.8, rest))
	addr := freePort(t)
	out := filepath.Join(dir, "samples.json")
	gen := proc.Start(t, loadBin, proc.Args("loadgen", "-addr="+addr, "-rate="+strconv.Itoa(rate), "-duration="+duration.String(), "-out="+out), proc.NoAddrFile())

	d := startBinary(t, daemonBin, nil, h.args(addr, "--slots="+strconv.Itoa(leaked+100), "--pool-size=16")...)
	d.waitServing(2 * time.Minute)
	serving := time.Now().UnixNano()
	fdsServing, grServing, rssServing := d.fds(), d.goroutines(), d.rss()

	if code := gen.Wait(duration + 2*time.Minute); code != 0 {
		t.Fatalf("load generator: exit code %d", code)
	}
	f := readLoadFigures(t, out, serving)
	samples, failed, lat, p := f.samples, f.failed, f.lat, f.percentile
	// The background reclaim's report is part of the figures, and a stop
	// before it ends would leave the rest for a next start.
	d.waitReclaimed(2 * time.Minute)
	waitFor(t, 30*time.Second, "descriptors and goroutines to settle after the load", func() bool {
		return d.fds() <= fdsServing+2 && (grServing < 0 || d.goroutines() <= grServing+5)
	})
	summary := fmt.Sprintf("%d checks at %d/s for %v over a reclaim of %d slots: %d failed; "+
		"gRPC p50 %v p99 %v, HTTP p50 %v p99 %v; sent while starting (%d): p99 %v max %v, once serving (%d): p99 %v; "+
		"after the load: fds %d -> %d, goroutines %d -> %d, RSS %d -> %d KiB; %s",
		len(samples), rate, duration, leaked, len(failed),
		p("grpc", 0.5), p("grpc", 0.99), p("http", 0.5), p("http", 0.99),
		len(lat["starting"]), p("starting", 0.99), p("starting", 1), len(lat["serving"]), p("serving", 0.99),
		fdsServing, d.fds(), grServing, d.goroutines(), rssServing, d.rss(), reclaimLine(d.Output()))
	t.Log(summary)
	writeReport(t, report, summary+"\n")
	if len(failed) > 0 {
		t.Errorf("%d of %d health checks failed, e.g. %q", len(failed), len(samples), failed[0])
	}
	if want := int(float64(rate) * duration.Seconds() * 0.9); len(samples) < want {
		t.Errorf("only %d checks were sent, want about %d", len(samples), want)
	}
	if rss := d.rss(); rssServing > 0 && rss > 2*rssServing+16*1024 {
		t.Errorf("RSS grew from %d to %d KiB under load", rssServing, rss)
	}
	d.signal(syscall.SIGTERM)
	if code := d.wait(30 * time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	h.stoppedCleanly(h.prefix, nil)
}

// loadFigures are the load generator's samples: those that failed, and
// the latencies by kind and by whether the check was sent while the
// daemon was starting (reclaiming) or once it served.
type loadFigures struct {
	samples []loadSample
	failed  []string
	lat     map[string][]int64
}

// readLoadFigures reads the samples the load generator wrote to out;
// serving is when the daemon served (Unix nanoseconds).
func readLoadFigures(t *testing.T, out string, serving int64) loadFigures {
	t.Helper()
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	f := loadFigures{lat: map[string][]int64{}}
	if err := json.Unmarshal(b, &f.samples); err != nil {
		t.Fatal(err)
	}
	for _, s := range f.samples {
		if s.Err != "" {
			f.failed = append(f.failed, s.Err)
			continue
		}
		when := "starting"
		if s.At >= serving {
			when = "serving"
		}
		f.lat[s.Kind] = append(f.lat[s.Kind], s.Latency)
		f.lat[when] = append(f.lat[when], s.Latency)
	}
	return f
}

// percentile is the q-quantile of the latencies under key, 0 if none.
func (f loadFigures) percentile(key string, q float64) time.Duration {
	l := f.lat[key]
	if len(l) == 0 {
		return 0
	}
	slices.Sort(l)
	return time.Duration(l[int(q*float64(len(l)-1))])
}

// rss is the daemon's resident set size in KiB.
func (d *daemon) rss() int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(d.Pid()) + "/status")
	if err != nil {
		return -1
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			n, _ := strconv.Atoi(strings.Fields(v)[0])
			return n
		}
	}
	return -1
}

// waitHostIdle waits until the machine's CPUs were at least minIdle idle
// over a second, or until timeout, and returns how long it waited. Go runs
// test packages in parallel, so the host may never come to rest: the test
// then goes on and its log says so.
func waitHostIdle(t *testing.T, minIdle float64, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for time.Since(start) < timeout {
		busy0, total0 := cpuTimes(t)
		time.Sleep(time.Second)
		busy1, total1 := cpuTimes(t)
		if total1 > total0 && 1-float64(busy1-busy0)/float64(total1-total0) >= minIdle {
			return time.Since(start)
		}
	}
	t.Logf("the host did not come to rest (%.0f%% idle) within %v", minIdle*100, timeout)
	return time.Since(start)
}

// cpuTimes returns the busy and total jiffies of all CPUs from /proc/stat.
func cpuTimes(t *testing.T) (busy, total uint64) {
	t.Helper()
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		t.Fatal(err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal ...
	if len(f) < 9 || f[0] != "cpu" {
		t.Fatalf("/proc/stat: unexpected first line %q", line)
	}
	for i, v := range f[1:9] {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("/proc/stat: %q: %v", line, err)
		}
		total += n
		if i != 3 && i != 4 { // idle, iowait
			busy += n
		}
	}
	return busy, total
}
