// Command catalog is a product catalog whose startup is gated by phasegate:
// it loads its configuration, migrates a bbolt store's schema in 20 steps,
// warms an in-memory cache and only then serves its gRPC service and its
// HTTP route, on one port that answers health checks from the first
// millisecond.
//
//	config ──► listen ─────────────┐
//	      └──► migrate ──► warm ───┴──► register ──► serve
//
// Run it:
//
//	go run ./catalog -listen 127.0.0.1:7000 -config catalog.json
//
// and watch it start from another terminal:
//
//	curl -N 127.0.0.1:7000/debug/events       # every transition, as it happens
//	curl 127.0.0.1:7000/health?pretty          # 503 "phase migrate 7/20 migrations: …", then 200
//	curl 127.0.0.1:7000/v1/products/SKU-000042 # 503 with the reason until serving
//	grpc-health-probe -addr 127.0.0.1:7000     # NOT_SERVING, then SERVING
//	open http://127.0.0.1:7000/debug/startup   # the start as a timeline
//
// OTEL_TRACES_EXPORTER=console (or otlp) traces the start: a span per phase
// and one per migration. SIGINT or SIGTERM drains (a second one cuts the
// drain short); a start that fails, or a failure after serving, exits 1.
// A second catalog on the same store waits in migrate, saying so in its
// health, until the first one stops.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"

	"github.com/phasegate/phasegate/app"
	"github.com/phasegate/phasegate/examples/catalog/catalogdb"
	"github.com/phasegate/phasegate/examples/catalog/catalogv1"
	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/metrics"
	"github.com/phasegate/phasegate/metrics/prometheus"
	"github.com/phasegate/phasegate/tracing"
	"github.com/phasegate/phasegate/tracing/console"
	"github.com/phasegate/phasegate/tracing/otlp"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:7000", "the address of the one port for gRPC and HTTP")
	config := flag.String("config", "", "a JSON configuration file (default: catalog.db here, 1000 demo products)")
	flag.Parse()
	cfg := app.DefaultConfig("catalog", *listen)
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	// What the catalog exports, and so links: spans to OTLP or the
	// console when OTEL_TRACES_EXPORTER asks, and /metrics.
	cfg.TraceExporters = []tracing.Exporter{otlp.Exporter(), console.Exporter()}
	cfg.MetricExporters = []metrics.Exporter{prometheus.Exporter()}
	a, err := newCatalog(cfg, *config)
	if err != nil {
		fmt.Fprintln(os.Stderr, "catalog:", err)
		os.Exit(2)
	}
	os.Exit(a.Main())
}

// newCatalog declares the catalog's phases, its gRPC service and its HTTP
// route. Nothing runs until the App starts.
func newCatalog(cfg app.Config, configFile string) (*app.App, error) {
	c := &catalog{configFile: configFile}
	cfg.ListenAfter = []string{"config"} // a bad configuration never opens the port
	a, err := app.New(cfg,
		lifecycle.Phase{Name: "config", Run: c.loadConfig},
		lifecycle.Phase{Name: "migrate", DependsOn: []string{"config"}, Run: c.migrate, Stop: c.closeStore},
		lifecycle.Phase{Name: "warm", DependsOn: []string{"migrate"}, Run: c.warm},
		lifecycle.Phase{Name: "register", DependsOn: []string{"warm", app.PhaseListen}, Run: c.register},
	)
	if err != nil {
		return nil, err
	}
	c.srv = a.Server()
	if err := errors.Join(c.srv.Declare(&catalogv1.ServiceDesc), c.srv.DeclareHTTP(catalogdb.RouteProduct)); err != nil {
		_ = a.Stop(context.Background()) // New started the health observers
		return nil, err
	}
	return a, nil
}
