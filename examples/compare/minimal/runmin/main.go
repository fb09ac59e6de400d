// Command runmin is the minimal service on oklog/run: the config step in
// main, then a group of the server and a signal handler (see package
// minimal).
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
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "the address of the one port for gRPC and HTTP")
	fail := flag.Bool("fail", false, "make the config step fail")
	slow := flag.Duration("slow", 0, "how long the config step takes")
	flag.Parse()
	if err := serve(*listen, *fail, *slow); err != nil {
		fmt.Fprintln(os.Stderr, "runmin:", err)
		os.Exit(1)
	}
}

func serve(listen string, fail bool, slow time.Duration) error {
	if fail {
		return errors.New("config: bad value")
	}
	time.Sleep(slow) // the group, and its signal handler, start after the config step
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
	l, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	ctx := context.Background()
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
