package main

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/phasegate/phasegate/app/status"
)

func probeCmd(ctx context.Context, e env) int {
	fs := flag.NewFlagSet("probe", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:5008", "daemon address")
	service := fs.String("service", "", `gRPC health service to check ("" is the daemon's overall readiness)`)
	useHTTP := fs.Bool("http", false, "ask GET /readyz over HTTP instead of grpc.health.v1")
	timeout := fs.Duration("timeout", 2*time.Second, "how long to wait for an answer")
	var tf clientTLSFlags
	tf.register(fs)
	if code, done := e.parseCommand(fs, "probe [flags]"); done {
		return code
	}
	tc, err := tf.config()
	if err != nil {
		fmt.Fprintf(e.stderr, "phasegate probe: %v\n", err)
		return exitUsage
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	var serving bool
	var detail string
	if *useHTTP {
		serving, detail, err = status.ProbeHTTP(ctx, *addr, tc)
	} else {
		serving, detail, err = probeGRPC(ctx, *addr, *service, tc)
	}
	if err != nil {
		fmt.Fprintf(e.stderr, "phasegate probe: %s: %v\n", *addr, err)
		return exitUsage
	}
	fmt.Fprintln(e.stdout, detail)
	if !serving {
		return exitFailed
	}
	return exitOK
}

func probeGRPC(ctx context.Context, addr, service string, tc *tls.Config) (bool, string, error) {
	creds := insecure.NewCredentials()
	if tc != nil {
		creds = credentials.NewTLS(tc)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return false, "", err
	}
	defer conn.Close()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service}, grpc.WaitForReady(false))
	if err != nil {
		return false, "", err
	}
	return resp.GetStatus() == healthpb.HealthCheckResponse_SERVING, resp.GetStatus().String(), nil
}
