package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/signal"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// controlMain is the `control` subcommand: the control server of the load
// part, a bare process with no phasegate in it — net/http answering GET
// /health with 200 on -http, and grpc-go's own health server (service "",
// SERVING) on -grpc — probed the same way as the daemon in the same run,
// so that every latency figure of the daemon stands beside what the
// machine alone gives a server. It serves until SIGINT/SIGTERM.
func controlMain(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("control", flag.ContinueOnError)
	fs.SetOutput(stderr)
	httpAddr := fs.String("http", "", "127.0.0.1:port for HTTP GET /health")
	grpcAddr := fs.String("grpc", "", "127.0.0.1:port for grpc.health.v1")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if *httpAddr == "" || *grpcAddr == "" {
		fmt.Fprintln(stderr, "control: need -http and -grpc addresses")
		return exitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := serveControl(ctx, *httpAddr, *grpcAddr); err != nil {
		fmt.Fprintln(stderr, "control:", err)
		return exitError
	}
	return exitOK
}

func serveControl(ctx context.Context, httpAddr, grpcAddr string) error {
	hl, err := net.Listen("tcp", httpAddr)
	if err != nil {
		return err
	}
	gl, err := net.Listen("tcp", grpcAddr)
	if err != nil {
		hl.Close()
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	gs := grpc.NewServer()
	healthpb.RegisterHealthServer(gs, health.NewServer()) // service "" is SERVING
	errs := make(chan error, 2)
	go func() { errs <- hs.Serve(hl) }()
	go func() { errs <- gs.Serve(gl) }()
	select {
	case <-ctx.Done():
	case err = <-errs:
	}
	gs.Stop()
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = hs.Shutdown(sctx)
	<-errs
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}
