// Command fxmin is the minimal service on uber-go/fx: a config constructor
// and a server whose hooks bind and drain the port (see package minimal).
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
)

type flags struct {
	listen string
	fail   bool
	slow   time.Duration
}

type config struct{ listen string }

func main() {
	var f flags
	flag.StringVar(&f.listen, "listen", "127.0.0.1:0", "the address of the one port for gRPC and HTTP")
	flag.BoolVar(&f.fail, "fail", false, "make the config step fail")
	flag.DurationVar(&f.slow, "slow", 0, "how long the config step takes")
	flag.Parse()
	fx.New(fx.Supply(f), fx.Provide(loadConfig, newServer), fx.Invoke(func(*http.Server) {})).Run()
}

func loadConfig(f flags) (config, error) {
	if f.fail {
		return config{}, errors.New("config: bad value")
	}
	time.Sleep(f.slow) // a constructor has no context
	return config{listen: f.listen}, nil
}

func newServer(lc fx.Lifecycle, cfg config) *http.Server {
	srv, hs := server()
	lc.Append(fx.Hook{
		OnStart: func(context.Context) error {
			l, err := net.Listen("tcp", cfg.listen)
			if err != nil {
				return err
			}
			go func() { _ = srv.Serve(l) }()
			return nil
		},
		OnStop: func(ctx context.Context) error {
			hs.Shutdown()
			return srv.Shutdown(ctx)
		},
	})
	return srv
}

// server serves gRPC health and HTTP /health on one port.
func server() (*http.Server, *health.Server) {
	hs := health.NewServer()
	gs := grpc.NewServer()
	healthpb.RegisterHealthServer(gs, hs)
	mux := http.NewServeMux()
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
	return srv, hs
}
