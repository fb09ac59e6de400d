// Command fxcatalog is the catalog example wired with go.uber.org/fx
// instead of phasegate, for docs/FRAMEWORK.md: the same work
// (package catalogdb), the same gRPC service and HTTP route on one port,
// grpc.health.v1 and a /health endpoint, signals. It is written the way fx
// is meant to be used: constructors build, OnStart hooks do the I/O in
// dependency order, OnStop hooks undo it in reverse.
//
// What it does not do, and phasegate does, is listed in FRAMEWORK.md; the
// first difference shows at once: the port binds only after the migration
// and the warm-up, so until then clients get "connection refused".
package main

import (
	"context"
	"errors"
	"flag"
	"net"
	"net/http"
	"strings"
	"time"

	"go.uber.org/fx"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/phasegate/phasegate/examples/catalog/catalogdb"
	"github.com/phasegate/phasegate/examples/catalog/catalogv1"
)

type flags struct{ listen, config string }

func main() {
	var f flags
	flag.StringVar(&f.listen, "listen", "127.0.0.1:7000", "the address of the one port for gRPC and HTTP")
	flag.StringVar(&f.config, "config", "", "a JSON configuration file")
	flag.Parse()
	fx.New(
		fx.Supply(f),
		fx.StartTimeout(10*time.Minute), // fx's default is 15 s, too short for a migration
		fx.Provide(loadConfig, openStore, warm, newServer),
		fx.Invoke(func(*http.Server) {}),
	).Run()
}

func loadConfig(f flags) (catalogdb.Config, error) { return catalogdb.LoadConfig(f.config) }

// openStore opens and migrates the store in an OnStart hook: fx runs
// hooks under its start timeout, in the order they were appended.
func openStore(lc fx.Lifecycle, cfg catalogdb.Config) *catalogdb.Store {
	s := new(catalogdb.Store)
	lc.Append(fx.Hook{
		OnStart: func(ctx context.Context) error {
			opened, err := catalogdb.Open(ctx, cfg, nil)
			if err != nil {
				return err
			}
			*s = *opened
			return s.Migrate(ctx, func(int, int, string) {})
		},
		OnStop: func(context.Context) error { return s.Close() },
	})
	return s
}

func warm(lc fx.Lifecycle, s *catalogdb.Store) *catalogdb.Server {
	srv := new(catalogdb.Server)
	lc.Append(fx.Hook{OnStart: func(ctx context.Context) error {
		c, err := catalogdb.Warm(ctx, s, func(int, int) {})
		if err == nil {
			*srv = *catalogdb.NewServer(c)
		}
		return err
	}})
	return srv
}

func newServer(lc fx.Lifecycle, f flags, cat *catalogdb.Server) *http.Server {
	hs := health.NewServer()
	gs := grpc.NewServer()
	gs.RegisterService(&catalogv1.ServiceDesc, cat)
	healthpb.RegisterHealthServer(gs, hs)
	mux := http.NewServeMux()
	mux.Handle(catalogdb.RouteProduct, cat)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		if st, err := hs.Check(r.Context(), &healthpb.HealthCheckRequest{}); err != nil || st.Status != healthpb.HealthCheckResponse_SERVING {
			http.Error(w, "not serving", http.StatusServiceUnavailable)
		}
	})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor == 2 && strings.HasPrefix(r.Header.Get("Content-Type"), "application/grpc") {
			gs.ServeHTTP(w, r)
			return
		}
		mux.ServeHTTP(w, r)
	})}
	srv.Protocols = new(http.Protocols)
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
	lc.Append(fx.Hook{
		OnStart: func(context.Context) error {
			l, err := net.Listen("tcp", f.listen)
			if err != nil {
				return err
			}
			go func() { _ = srv.Serve(l) }()
			return nil
		},
		OnStop: func(ctx context.Context) error {
			hs.Shutdown()
			return errors.Join(srv.Shutdown(ctx), ctx.Err())
		},
	})
	return srv
}
