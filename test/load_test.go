package test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// loadSample is what test/bench's load generator records per request.
type loadSample struct {
	Kind    string `json:"k"`
	Latency int64  `json:"lat"`
	Err     string `json:"err"`
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
	leaked, rate, duration := 1000, 2000, 15*time.Second
	if os.Getenv("PHASEGATE_LOAD_LONG") == "1" {
		leaked, rate, duration = 5000, 5000, 60*time.Second
	}
	// Both sides are built without the race detector: this measures a
	// daemon as it runs in production.
	dir := t.TempDir()
	daemonBin, loadBin := filepath.Join(dir, "phasegate"), filepath.Join(dir, "bench")
	run(t, "go", "build", "-o", daemonBin, "../cmd/phasegate")
	run(t, "go", "build", "-o", loadBin, "./bench")

	h := newHost(t)
	h.leak(h.prefix, 1, leaked)
	addr := freePort(t)
	out := filepath.Join(dir, "samples.json")
	gen := exec.Command(loadBin, "loadgen", "-addr="+addr, "-rate="+strconv.Itoa(rate), "-duration="+duration.String(), "-out="+out)
	genLogs := &syncBuffer{}
	gen.Stdout, gen.Stderr = genLogs, genLogs
	if err := gen.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gen.Process.Kill(); _ = gen.Wait() })

	d := startBinary(t, daemonBin, nil, h.args(addr, "--slots="+strconv.Itoa(leaked+100), "--pool-size=16")...)
	d.waitServing(2 * time.Minute)
	fdsServing, grServing, rssServing := d.fds(), d.goroutines(), d.rss()

	if err := gen.Wait(); err != nil {
		t.Fatalf("load generator: %v\n%s", err, genLogs.String())
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var samples []loadSample
	if err := json.Unmarshal(b, &samples); err != nil {
		t.Fatal(err)
	}
	var failed []string
	lat := map[string][]int64{}
	for _, s := range samples {
		if s.Err != "" {
			failed = append(failed, s.Err)
			continue
		}
		lat[s.Kind] = append(lat[s.Kind], s.Latency)
	}
	p := func(kind string, q float64) time.Duration {
		l := lat[kind]
		if len(l) == 0 {
			return 0
		}
		slices.Sort(l)
		return time.Duration(l[int(q*float64(len(l)-1))])
	}
	waitFor(t, 30*time.Second, "descriptors and goroutines to settle after the load", func() bool {
		return d.fds() <= fdsServing+2 && (grServing < 0 || d.goroutines() <= grServing+5)
	})
	summary := fmt.Sprintf("%d checks at %d/s for %v over a reclaim of %d slots: %d failed; "+
		"gRPC p50 %v p99 %v, HTTP p50 %v p99 %v; after the load: fds %d -> %d, goroutines %d -> %d, RSS %d -> %d KiB; %s",
		len(samples), rate, duration, leaked, len(failed),
		p("grpc", 0.5), p("grpc", 0.99), p("http", 0.5), p("http", 0.99),
		fdsServing, d.fds(), grServing, d.goroutines(), rssServing, d.rss(), reclaimLine(d.logs.String()))
	t.Log(summary)
	writeReport(t, "load.txt", summary+"\n")
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
	h.assertClean(h.prefix, nil)
}

// rss is the daemon's resident set size in KiB.
func (d *daemon) rss() int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(d.cmd.Process.Pid) + "/status")
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
