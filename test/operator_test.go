package test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
	"github.com/phasegate/phasegate/network/nft"
)

// scrapeMetrics reads the daemon's /metrics.
func scrapeMetrics(t *testing.T, d *daemon) map[string]*dto.MetricFamily {
	t.Helper()
	code, body, err := d.get("/metrics")
	if err != nil || code != http.StatusOK {
		t.Fatalf("GET /metrics: %d %v", code, err)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return fams
}

// metricValue is the value of the sample of family name whose labels
// include want (a histogram's count), or -1 when there is none.
func metricValue(fams map[string]*dto.MetricFamily, name string, want ...string) float64 {
	f := fams[name]
	if f == nil {
		return -1
	}
next:
	for _, m := range f.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		for i := 0; i+1 < len(want); i += 2 {
			if labels[want[i]] != want[i+1] {
				continue next
			}
		}
		switch {
		case m.Gauge != nil:
			return m.Gauge.GetValue()
		case m.Counter != nil:
			return m.Counter.GetValue()
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount())
		}
	}
	return -1
}

// After a start on a dirty host, /metrics has every phase's duration, the
// reclaim report, the pool, slot acquire latency and the health checks
// served, with the values of this start; and /debug/startup draws a bar
// per phase in a real browser.
func TestOperatorMetricsAndTimeline(t *testing.T) {
	const leaked = 300
	h := newHost(t)
	h.leak(h.prefix, 1, leaked)
	d := start(t, nil, h.args(freePort(t))...)
	d.waitReclaimed(2 * time.Minute)

	conn := dial(t, d.addr)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	slots := d.slots()
	got, err := slots.Acquire(ctx, &phasegatev1.AcquireRequest{Owner: "metrics-test", RequestId: "m1"})
	if err != nil {
		t.Fatal(err)
	}

	var fams map[string]*dto.MetricFamily
	waitFor(t, 30*time.Second, "every phase's duration in /metrics", func() bool {
		fams = scrapeMetrics(t, d)
		return metricValue(fams, "phasegate_phase_duration_seconds", "phase", "serve", "outcome", "succeeded") == 1 &&
			metricValue(fams, "rpc_server_call_duration_seconds", "rpc_method", "phasegate.v1.Slots/Acquire") == 1
	})
	checkStartMetrics(t, fams, leaked)
	if _, err := slots.Release(ctx, &phasegatev1.ReleaseRequest{Index: got.GetSlot().GetIndex(), LeaseId: got.GetLeaseId()}); err != nil {
		t.Fatal(err)
	}

	t.Run("timeline in chromium", func(t *testing.T) {
		chrome := lookChromium(t)
		bars, names := loadTimeline(t, chrome, "http://"+d.addr+"/debug/startup", os.Getenv("PHASEGATE_SCREENSHOT_DIR"))
		if bars != len(phaseDeps) {
			t.Errorf("%d phase bars rendered, want %d (names %q)", bars, len(phaseDeps), names)
		}
		for phase := range phaseDeps {
			if !strings.Contains(names, phase) {
				t.Errorf("no bar for phase %s in %q", phase, names)
			}
		}
	})

	d.signal(syscall.SIGTERM)
	if code := d.wait(time.Minute); code != 0 {
		t.Errorf("exit %d", code)
	}
}

// checkStartMetrics checks the metrics of a start that reclaimed leaked
// slots and served one Acquire and one gRPC health check: every phase's
// duration, the lifecycle, the reclaim report, the pool, the Acquire's
// latency, the health checks, and otelgrpc measuring the Slots call and
// not the health checks.
func checkStartMetrics(t *testing.T, fams map[string]*dto.MetricFamily, leaked float64) {
	t.Helper()
	for phase := range phaseDeps {
		if v := metricValue(fams, "phasegate_phase_duration_seconds", "phase", phase, "outcome", "succeeded"); v != 1 {
			t.Errorf("phase %s: duration count %v, want 1", phase, v)
		}
	}
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"phasegate_lifecycle_state", []string{"state", "serving"}, 1},
		{"phasegate_lifecycle_state", []string{"state", "starting"}, 0},
		{"phasegate_reclaim_slots_total", []string{"result", "found"}, leaked},
		{"phasegate_reclaim_slots_total", []string{"result", "reclaimed"}, leaked},
		{"phasegate_reclaim_slots_total", []string{"result", "failed"}, 0},
		{"phasegate_reclaim_slots_total", []string{"result", "deferred"}, 0},
		{"phasegate_pool_size", nil, 4},
		{"phasegate_pool_slots", []string{"state", "acquired"}, 1},
		{"phasegate_slot_acquire_duration_seconds", []string{"code", "OK"}, 1},
		{"phasegate_health_checks_total", []string{"dialect", "grpc", "result", "pass"}, 1},
	} {
		if v := metricValue(fams, c.name, c.labels...); v != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, v, c.want)
		}
	}
	if v := metricValue(fams, "phasegate_health_checks_total", "dialect", "readyz", "result", "pass"); v < 1 {
		t.Errorf("readyz passes counted %v, want at least the one that saw serving", v)
	}
	if v := metricValue(fams, "phasegate_lifecycle_startup_seconds"); v <= 0 {
		t.Errorf("startup seconds %v", v)
	}
	if v := metricValue(fams, "phasegate_lifecycle_since_start_seconds"); v <= 0 {
		t.Errorf("since start %v", v)
	}
	// otelgrpc's own histogram: the Slots call is measured, health checks
	// are not.
	if v := metricValue(fams, "rpc_server_call_duration_seconds", "rpc_method", "phasegate.v1.Slots/Acquire"); v != 1 {
		t.Errorf("otelgrpc Acquire calls %v, want 1 (%v)", v, fams["rpc_server_call_duration_seconds"])
	}
	if v := metricValue(fams, "rpc_server_call_duration_seconds", "rpc_method", "grpc.health.v1.Health/Check"); v != -1 {
		t.Errorf("health checks measured by otelgrpc: %v", v)
	}
}

func familyNames(fams map[string]*dto.MetricFamily, prefix string) []string {
	var out []string
	for n := range fams {
		if strings.HasPrefix(n, prefix) {
			out = append(out, n)
		}
	}
	return out
}

// lookChromium finds Debian's chromium; without it the test fails when
// PHASEGATE_REQUIRE_TOOLS=1 and is skipped otherwise.
func lookChromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	const install = "apt-get install chromium fonts-liberation"
	if os.Getenv("PHASEGATE_REQUIRE_TOOLS") == "1" {
		t.Fatalf("chromium not found; install it with: %s", install)
	}
	t.Skipf("chromium not found; install it with: %s", install)
	return ""
}

// loadTimeline opens url in headless Chromium and returns how many phase
// bars the SVG draws and their names; with shotDir set it saves a
// screenshot of the page there as startup-timeline.png.
func loadTimeline(t *testing.T, chrome, url, shotDir string) (int, string) {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chrome),
		chromedp.Flag("headless", true),
		chromedp.Flag("no-sandbox", true),
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("hide-scrollbars", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1160, 760),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx)
	defer cancelBrowser()
	// The first action starts the browser, under the browser's context;
	// later ones are bounded.
	if err := chromedp.Do(bctx, chromedp.Navigate(url)); err != nil {
		t.Fatalf("chromium: %v", err)
	}
	ctx, cancel := context.WithTimeout(bctx, 90*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS("#timeline"))); err != nil {
		t.Fatalf("chromium: %v", err)
	}
	bars, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("#timeline g.bar.phase").length`))
	if err != nil {
		t.Fatalf("chromium: %v", err)
	}
	names, err := chromedp.Run(ctx, chromedp.Evaluate[string](`Array.from(document.querySelectorAll("#timeline g.bar.phase")).map(g => g.dataset.name + "=" + g.dataset.state).join(" ")`))
	if err != nil {
		t.Fatalf("chromium: %v", err)
	}
	if shotDir != "" {
		shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatalf("chromium screenshot: %v", err)
		}
		p := filepath.Join(shotDir, "startup-timeline.png")
		if err := os.WriteFile(p, shot, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot: %s", p)
	}
	return bars, names
}

// `phasegate demo` end to end with a small N: it leaks slots, starts a
// daemon that serves, shows the health answers going from 503 to 200 and
// where the timeline is, and on Ctrl-C stops the daemon and leaves nothing
// behind.
func TestDemo(t *testing.T) {
	h := newHost(t)
	dir := filepath.Join(t.TempDir(), "demo")
	demo := startDemo(t, dir, "--leaked=400", "--prefix="+h.prefix, "--dir="+dir, "--listen="+freePort(t))
	addr := demo.waitServing(t)
	resp, err := http.Get("http://" + addr + "/debug/startup")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || strings.Count(string(page), `class="bar phase"`) != len(phaseDeps) {
		t.Errorf("timeline page: %d, %d phase bars", resp.StatusCode, strings.Count(string(page), `class="bar phase"`))
	}
	if len(h.links(h.prefix)) == 0 {
		t.Error("no pool slot links while the demo's daemon serves")
	}

	demo.interrupt(t)
	o := demo.out.String()
	for _, want := range []string{"1. Leaking 400 slots", "\nserving lock=succeeded", " 503 fail: starting", " 200 ", "cleaned up: the daemon stopped"} {
		if !strings.Contains(o, want) {
			t.Errorf("demo output lacks %q", want)
		}
	}
	// 200 pass, or 200 warn while it reclaims the dead in the background
	// (or egress needs ip_forward on this host).
	if i, j := strings.Index(o, " 503 fail"), strings.Index(o, " 200 "); i < 0 || j < i {
		t.Errorf("health answers not 503 then 200")
	}
	// Nothing left: no link, no netns file or mount, no nftables table.
	if l := h.links(h.prefix); len(l) > 0 {
		t.Errorf("links left: %v", l)
	}
	h.netnsDir = filepath.Join(dir, "netns")
	if f := h.netnsFiles(h.prefix); len(f) > 0 {
		t.Errorf("netns files left: %v", f)
	}
	if m := h.mounts(h.prefix); len(m) > 0 {
		t.Errorf("mounts left: %v", m)
	}
	if b, _ := exec.Command("nft", "list", "tables").Output(); strings.Contains(string(b), nft.TableName(h.prefix)) {
		t.Errorf("nftables table %s left", nft.TableName(h.prefix))
	}
}

// demoRun is a running `phasegate demo`: its lines as they come, all of
// its output, and its exit.
type demoRun struct {
	cmd    *exec.Cmd
	lines  chan string
	out    syncBuffer
	exited chan error
}

// startDemo starts `phasegate demo` with args; the demo's output, stderr
// and daemon log (in dir) are logged if the test fails.
func startDemo(t *testing.T, dir string, args ...string) *demoRun {
	t.Helper()
	cmd := exec.Command(binary, append([]string{"demo"}, args...)...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := &demoRun{cmd: cmd, lines: make(chan string, 1024), exited: make(chan error, 1)}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			r.out.Write([]byte(sc.Text() + "\n"))
			r.lines <- sc.Text()
		}
		close(r.lines)
		r.exited <- cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		if t.Failed() {
			t.Logf("demo output:\n%s\nstderr:\n%s", r.out.String(), stderr.String())
			if b, err := os.ReadFile(filepath.Join(dir, "daemon.log")); err == nil {
				t.Logf("daemon log:\n%s", b)
			}
		}
	})
	return r
}

// waitServing reads the demo's lines until it asks for Ctrl-C and returns
// the address where it said the timeline is.
func (r *demoRun) waitServing(t *testing.T) string {
	t.Helper()
	timelineRE := regexp.MustCompile(`http://(127\.0\.0\.1:\d+)/debug/startup`)
	var addr string
	deadline := time.After(3 * time.Minute)
	for {
		select {
		case l, ok := <-r.lines:
			if !ok {
				t.Fatalf("demo ended before serving: %v", <-r.exited)
			}
			if m := timelineRE.FindStringSubmatch(l); m != nil {
				addr = m[1]
			}
			if strings.Contains(l, "Press Ctrl-C") {
				if addr == "" {
					t.Fatal("demo did not say where the timeline is")
				}
				return addr
			}
		case <-deadline:
			t.Fatal("demo did not reach serving")
		}
	}
}

// interrupt sends the demo Ctrl-C (SIGINT) and waits up to a minute for
// it to exit 0.
func (r *demoRun) interrupt(t *testing.T) {
	t.Helper()
	_ = r.cmd.Process.Signal(syscall.SIGINT)
	for range r.lines {
	}
	select {
	case err := <-r.exited:
		if err != nil {
			t.Errorf("demo exit: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("demo did not exit after Ctrl-C")
	}
}
