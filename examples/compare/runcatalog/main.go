// Command runcatalog is the catalog example wired with github.com/oklog/run
// instead of phasegate, for docs/FRAMEWORK.md: the same work (package
// catalogdb), the same gRPC service and HTTP route on one port,
// grpc.health.v1 and a /health endpoint, signals. It is written the way
// run is meant to be used: main prepares what the actors need, one step
// after the other, then runs the long-lived actors (the server, the signal
// handler) as a group that stops together when the first one returns.
//
// What it does not do, and phasegate does, is listed in FRAMEWORK.md; as
// with fx, the port binds only once the store is migrated and the cache
// warm.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/oklog/run"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/phasegate/phasegate/examples/catalog/catalogdb"
	"github.com/phasegate/phasegate/examples/catalog/catalogv1"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:7000", "the address of the one port for gRPC and HTTP")
	config := flag.String("config", "", "a JSON configuration file")
	flag.Parse()
	if err := serve(*listen, *config); err != nil {
		fmt.Fprintln(os.Stderr, "runcatalog:", err)
		os.Exit(1)
	}
}

func serve(listen, config string) error {
	ctx := context.Background()
	cfg, err := catalogdb.LoadConfig(config)
	if err != nil {
		return err
	}
	s, err := catalogdb.Open(ctx, cfg, nil)
	if err != nil {
		return err
	}
	defer s.Close()
	if err := s.Migrate(ctx, func(int, int, string) {}); err != nil {
		return err
	}
	c, err := catalogdb.Warm(ctx, s, func(int, int) {})
	if err != nil {
		return err
	}
	cat := catalogdb.NewServer(c)

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
	l, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}

	var g run.Group
	g.Add(run.SignalHandler(ctx, syscall.SIGINT, syscall.SIGTERM))
	g.Add(func() error { return srv.Serve(l) }, func(error) {
		hs.Shutdown()
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	err = g.Run()
	var sig *run.SignalError
	if errors.As(err, &sig) || errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}
