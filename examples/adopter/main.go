// Command adopter is the service a new adopter built from the README alone,
// rebuilt as an example: a config phase that owns the flags' values, a
// bbolt store brought to its schema in three migrations, a cache of its
// 10,000 entries, an HTTP dependency (upstream) checked with retries
// beside the store, a hand-written gRPC service and an HTTP route, bound
// once everything they need is ready:
//
//	config ──► db ──► cache ──┐
//	      ├──► upstream ──────┼──► grpc ──► serve
//	      └──► listen ────────┘
//
// The config phase reads every flag, the port's address and drain delay
// included (app.Config.PortFrom): the port binds the moment config has
// succeeded, and answers NOT_SERVING while the rest runs.
//
// Run it:
//
//	go run ./adopter -listen 127.0.0.1:7000 -db adopter.db -upstream http://127.0.0.1:8080
//
// It serves grpc.health.v1 and /readyz (NOT_SERVING and 503 until serve),
// adopter.v1.Items/Lookup in gRPC and GET /v1/items/{key} in HTTP.
// -log-format=json logs JSON lines. A bad flag value fails config and exits
// 2 at once, and so does a -listen that cannot be bound; SIGINT or SIGTERM
// drains, during the start too, and exits 0.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/phasegate/phasegate/app"
	"github.com/phasegate/phasegate/lifecycle"
)

func main() {
	logFormat := flag.String("log-format", "text", "text or json")
	cfg := app.DefaultConfig("adopter", "")
	var f flags
	flag.StringVar(&f.listen, "listen", "127.0.0.1:7000", "the address of the one port for gRPC and HTTP")
	flag.StringVar(&f.drainDelay, "drain-delay", cfg.DrainDelay.String(), "how long health says NOT_SERVING before the port stops, once it served (at most "+cfg.DrainDelay.String()+")")
	flag.StringVar(&f.db, "db", "adopter.db", "the bbolt store's file")
	flag.StringVar(&f.upstream, "upstream", "http://127.0.0.1:8080", "the upstream's base URL (its /ping must answer 200)")
	flag.StringVar(&f.entries, "cache-entries", "10000", "how many entries the store holds and the cache loads")
	flag.Parse()
	log, err := logger(os.Stderr, *logFormat)
	if err != nil {
		fmt.Fprintln(os.Stderr, "adopter:", err)
		os.Exit(2)
	}
	cfg.Logger = log
	a, err := newService(cfg, f)
	if err != nil {
		fmt.Fprintln(os.Stderr, "adopter:", err)
		os.Exit(app.ExitCode(err))
	}
	os.Exit(a.Main())
}

// logger returns a logger writing to w in format.
func logger(w io.Writer, format string) (*slog.Logger, error) {
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, nil)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, nil)), nil
	}
	return nil, fmt.Errorf("-log-format %q: want text or json", format)
}

// newService declares the phases, the gRPC service and the HTTP route:
// the whole wiring. Nothing runs until the App starts.
func newService(cfg app.Config, f flags) (*app.App, error) {
	s := &service{flags: f}
	// The port's address and drain delay are configuration like the rest:
	// the config phase reads them, and the port binds once it has.
	cfg.PortFrom = s.port
	cfg.ListenAfter = []string{"config"}
	a, err := app.New(cfg,
		lifecycle.Phase{Name: "config", Run: s.config},
		lifecycle.Phase{Name: "db", DependsOn: []string{"config"}, Run: s.openDB, Stop: s.closeDB},
		lifecycle.Phase{Name: "cache", DependsOn: []string{"db"}, Run: s.fillCache},
		lifecycle.Phase{Name: "upstream", DependsOn: []string{"config"}, Run: s.checkUpstream, Timeout: 5 * time.Second,
			Retry: lifecycle.RetryPolicy{Attempts: 1000, Backoff: 10 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, Jitter: 0.2}},
		lifecycle.Phase{Name: "grpc", DependsOn: []string{"cache", "upstream", app.PhaseListen}, Run: s.bind},
	)
	if err != nil {
		return nil, err
	}
	s.srv = a.Server()
	if err := errors.Join(s.srv.Declare(&itemsDesc), s.srv.DeclareHTTP(routeItem)); err != nil {
		_ = a.Stop(context.Background()) // New started the health observers
		return nil, err
	}
	return a, nil
}
