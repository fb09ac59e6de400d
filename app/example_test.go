package app_test

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/phasegate/phasegate/app"
	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/metrics"
	"github.com/phasegate/phasegate/metrics/prometheus"
	"github.com/phasegate/phasegate/tracing"
	"github.com/phasegate/phasegate/tracing/otlp"
)

// A service declares its phases; the App adds listen, which binds the port
// at once, and serve, after everything else. Until serve, the port answers
// with the phase the service is in and how far it got; a route declared
// before the start and bound by a phase answers once the service serves.
// A program calls a.Main() instead of Start and Stop: it runs until a
// signal and returns the exit code.
func Example() {
	migrating, migrated := make(chan struct{}), make(chan struct{})
	var a *app.App // the phases run after New returned it
	cfg := app.DefaultConfig("catalog", "127.0.0.1:0")
	cfg.DrainDelay = 0 // no checker to wait for here
	a, err := app.New(cfg,
		lifecycle.Phase{Name: "config", Run: func(context.Context, *lifecycle.Progress) error { return nil }},
		// After listen too, only so that the example's first request
		// finds migrate alone running: the port answers while listen is
		// still ending, and its health would name both.
		lifecycle.Phase{Name: "migrate", DependsOn: []string{"config", app.PhaseListen}, Run: func(ctx context.Context, p *lifecycle.Progress) error {
			p.SetTotal(20, "migrations")
			p.SetDone(7)
			close(migrating)
			select {
			case <-migrated:
				p.SetDone(20)
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}},
		lifecycle.Phase{Name: "register", DependsOn: []string{"migrate", app.PhaseListen}, Run: func(context.Context, *lifecycle.Progress) error {
			return a.Server().BindHTTP("GET /v1/hello", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				fmt.Fprintln(w, "hello")
			}))
		}},
	)
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := a.Server().DeclareHTTP("GET /v1/hello"); err != nil {
		fmt.Println(err)
		return
	}

	ctx := context.Background()
	started := make(chan error, 1)
	go func() { started <- a.Start(ctx) }()
	c := &http.Client{Timeout: 10 * time.Second}
	defer c.CloseIdleConnections()
	get := func(path string) {
		resp, err := c.Get("http://" + a.Addr(ctx).String() + path)
		if err != nil {
			fmt.Println(err)
			return
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		fmt.Printf("%s %d %s", path, resp.StatusCode, body)
	}
	<-migrating
	get("/v1/hello")
	close(migrated)
	if err := <-started; err != nil {
		fmt.Println(err)
		return
	}
	get("/v1/hello")
	fmt.Println(a.Stop(ctx), a.Lifecycle().State())
	// Output:
	// /v1/hello 503 GET /v1/hello unavailable: starting: phase migrate 7/20 migrations
	// /v1/hello 200 hello
	// <nil> stopped
}

// A supervisor's kill timeout (systemd's TimeoutStopSec, Nomad's
// kill_timeout, Kubernetes' terminationGracePeriodSeconds) must exceed the
// longest orderly stop: the drain delay, the port's graceful stop, each
// phase's Stop and the background tasks, each within its bound.
func ExampleApp_StopBudget() {
	cfg := app.DefaultConfig("catalog", "127.0.0.1:0")
	fmt.Println("the port alone:", cfg.StopBudget())
	nop := func(context.Context, *lifecycle.Progress) error { return nil }
	a, err := app.New(cfg,
		lifecycle.Phase{Name: "store", Run: nop, Stop: func(context.Context) error { return nil }, StopTimeout: 30 * time.Second},
		lifecycle.Phase{Name: "cache", DependsOn: []string{"store"}, Run: nop, Stop: func(context.Context) error { return nil }},
	)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer a.Stop(context.Background()) // New started the health observers
	fmt.Println("the whole stop:", a.StopBudget())
	// Output:
	// the port alone: 25s
	// the whole stop: 1m15s
}

// A start fails at the latest when the slowest chain of phases has run
// out every attempt: here config (2s), then the longer of registry (5
// attempts of 300ms, 50ms apart doubling, 10% jitter: 2.325s) and
// cache-dir (1 attempt of 1m, which wins). The graph of the CI runner of
// docs/FRAMEWORK.md.
func ExampleApp_StartBudget() {
	nop := func(context.Context, *lifecycle.Progress) error { return nil }
	phases := []lifecycle.Phase{
		{Name: "config", Run: nop, Timeout: 2 * time.Second},
		{Name: "registry", DependsOn: []string{"config"}, Run: nop, Timeout: 300 * time.Millisecond,
			Retry: lifecycle.RetryPolicy{Attempts: 5, Backoff: 50 * time.Millisecond, Jitter: 0.1}},
		{Name: "cache-dir", DependsOn: []string{"config"}, Run: nop, Timeout: time.Minute},
	}
	registry, _ := phases[1].WorstCase()
	fmt.Println("registry alone:", registry)
	a, err := app.New(app.DefaultConfig("runner", "127.0.0.1:0"), phases...)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer a.Stop(context.Background())
	fmt.Println("the whole start:", a.StartBudget())
	// Output:
	// registry alone: 2.325s
	// the whole start: 1m2s
}

// A service links only the exporters it gives: here the Prometheus
// registry that /metrics serves, and spans to OTLP when
// OTEL_TRACES_EXPORTER=otlp asks. Without MetricExporters the App serves
// no /metrics and the binary holds no Prometheus client; without
// TraceExporters an OTEL_TRACES_EXPORTER naming one fails New, naming the
// package to add.
func ExampleConfig_exporters() {
	cfg := app.DefaultConfig("catalog", "127.0.0.1:0")
	cfg.DrainDelay = 0
	cfg.MetricExporters = []metrics.Exporter{prometheus.Exporter()}
	cfg.TraceExporters = []tracing.Exporter{otlp.Exporter()}
	a, err := app.New(cfg, lifecycle.Phase{Name: "config", Run: func(context.Context, *lifecycle.Progress) error { return nil }})
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx := context.Background()
	if err := a.Start(ctx); err != nil {
		fmt.Println(err)
		return
	}
	c := &http.Client{Timeout: 10 * time.Second}
	defer c.CloseIdleConnections()
	// A phase's duration is recorded by the metrics' subscriber to the
	// lifecycle a moment after the phase ends, so a scrape at once may not
	// hold it yet; the next one does.
	var (
		code int
		seen bool
	)
	for deadline := time.Now().Add(10 * time.Second); !seen && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		resp, err := c.Get("http://" + a.Addr(ctx).String() + app.PathMetrics)
		if err != nil {
			fmt.Println(err)
			return
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		code, seen = resp.StatusCode, strings.Contains(string(body), "phasegate_phase_duration_seconds")
	}
	fmt.Println(code, seen)
	fmt.Println(a.Stop(ctx))
	// Output:
	// 200 true
	// <nil>
}

// A config phase is the one place that reads configuration, the port's
// included: PortFrom hands the listen phase what the config phase parsed,
// once it ran (ListenAfter). Config.MaxDrainDelay is the most the phase
// may choose, and what the stop budgets count.
func ExampleConfig_portFrom() {
	var port app.Port // filled by the config phase
	cfg := app.DefaultConfig("catalog", "")
	cfg.MaxDrainDelay = 30 * time.Second
	cfg.ListenAfter = []string{"config"}
	cfg.PortFrom = func() (app.Port, error) { return port, nil }
	a, err := app.New(cfg, lifecycle.Phase{Name: "config", Run: func(context.Context, *lifecycle.Progress) error {
		fs := flag.NewFlagSet("catalog", flag.ContinueOnError)
		fs.StringVar(&port.Listen, "listen", "127.0.0.1:7000", "the address of the port")
		fs.DurationVar(&port.DrainDelay, "drain-delay", 5*time.Second, "the time checkers get to see NOT_SERVING")
		return fs.Parse([]string{"-listen", "127.0.0.1:0", "-drain-delay", "0s"}) // os.Args[1:] in a program
	}})
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx := context.Background()
	if err := a.Start(ctx); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(a.Addr(ctx).(*net.TCPAddr).IP)
	fmt.Println(a.Stop(ctx))
	// Output:
	// 127.0.0.1
	// <nil>
}

// A service reads its configuration files through a ConfigFiles, with its
// own checks, and gives it to the App. At SIGHUP the App reads each file
// again with the same checks (one that fails refuses the upgrade) and
// hands the new image what it read: there, ReadFile returns those bytes
// instead of reading the path, which may have changed during the drain.
// Started by anything but an upgrade, every file comes from its path.
func ExampleConfigFiles() {
	dir, err := os.MkdirTemp("", "example-config")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "limits.json")
	if err := os.WriteFile(path, []byte(`{"max": 10}`), 0o600); err != nil {
		fmt.Println(err)
		return
	}

	files := app.InheritConfigFiles() // first in main: it unsets the variable
	// The service's checks of the file, at a start and at each SIGHUP.
	readChecked := func(path string) ([]byte, error) {
		st, err := os.Lstat(path)
		if err != nil {
			return nil, err
		}
		if !st.Mode().IsRegular() || st.Mode().Perm()&0o022 != 0 {
			return nil, fmt.Errorf("%s: mode %v: want a regular file only its owner writes", path, st.Mode())
		}
		return os.ReadFile(path)
	}
	b, err := files.ReadFile(path, readChecked)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%s; %d handed over by a previous image\n", b, len(files.Handed()))

	cfg := app.DefaultConfig("limits", "127.0.0.1:0")
	cfg.UpgradeOnHangup = true
	cfg.ConfigFiles = files
	_ = cfg // app.New(cfg, phases...), and Main
	// Output: {"max": 10}; 0 handed over by a previous image
}
