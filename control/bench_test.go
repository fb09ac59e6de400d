package control_test

// The benchmark behind docs/BENCHMARKS.md ("The control surface under a
// flood"). Reproduce with:
//
//	go test -run '^$' -bench HealthDuringControlFlood -benchtime 20000x -count 3 ./control/

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	testpb "google.golang.org/grpc/interop/grpc_testing"

	"github.com/phasegate/phasegate/control"
	"github.com/phasegate/phasegate/health"
	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/server"
)

// BenchmarkHealthDuringControlFlood is a checker's grpc.health.v1 Check on
// the port, one call at a time, while the control socket is quiet and while
// four clients of this process's principal flood it: in alternating rounds
// of the same run, so that the machine's load falls on both alike. Run as
// any user but root, past the policy's 100 calls a second every call is
// refused by the guard's rate limit; root has no rate, so run as root the
// flood's calls are served in full, the costlier case. The ratio of the
// p99s is what the flood costs a checker.
func BenchmarkHealthDuringControlFlood(b *testing.B) {
	ctx := context.Background()
	pub := servePublicPort(ctx, b)
	sock := serveGuardedControl(ctx, b)
	checker := healthpb.NewHealthClient(dialBench(b, pub.Addr().String()))
	flooder := testpb.NewTestServiceClient(dialBench(b, "unix://"+sock))
	check := func() time.Duration {
		t0 := time.Now()
		if _, err := checker.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
			b.Fatal(err)
		}
		return time.Since(t0)
	}
	flood := func() (stop func() int64) { return floodControl(ctx, flooder) }
	for range 200 { // warm up both connections
		check()
		_, _ = flooder.UnaryCall(ctx, &testpb.SimpleRequest{})
	}

	const rounds = 10
	per := max(b.N/rounds, 1)
	var quiet, flooded []time.Duration
	var floodCalls int64
	var floodTime time.Duration
	b.ResetTimer()
	for r := range rounds {
		for _, withFlood := range []bool{r%2 == 0, r%2 != 0} {
			var stop func() int64
			t0 := time.Now()
			if withFlood {
				stop = flood()
			}
			for range per {
				if withFlood {
					flooded = append(flooded, check())
				} else {
					quiet = append(quiet, check())
				}
			}
			if withFlood {
				floodCalls += stop()
				floodTime += time.Since(t0)
			}
		}
	}
	b.StopTimer()
	slices.Sort(quiet)
	slices.Sort(flooded)
	pct := func(s []time.Duration, p int) float64 { return float64(s[(len(s)-1)*p/100]) / 1e3 }
	b.ReportMetric(pct(quiet, 50), "quiet-p50-µs")
	b.ReportMetric(pct(quiet, 99), "quiet-p99-µs")
	b.ReportMetric(pct(flooded, 50), "flood-p50-µs")
	b.ReportMetric(pct(flooded, 99), "flood-p99-µs")
	b.ReportMetric(pct(flooded, 99)/pct(quiet, 99), "p99-ratio")
	b.ReportMetric(float64(floodCalls)/floodTime.Seconds(), "flood-calls/s")
	b.ReportMetric(0, "ns/op")
}

// servePublicPort serves, until the benchmark ends, a port whose health
// follows a lifecycle with one phase, listen.
func servePublicPort(ctx context.Context, b *testing.B) *server.Server {
	var pub *server.Server
	lc, err := lifecycle.New([]lifecycle.Phase{{
		Name: "listen",
		Run:  func(ctx context.Context, _ *lifecycle.Progress) error { return pub.Serve(ctx) },
	}})
	if err != nil {
		b.Fatal(err)
	}
	hc := health.New(lc, health.Options{})
	b.Cleanup(hc.Close)
	cfg := server.DefaultConfig()
	cfg.Addr, cfg.Health, cfg.DrainDelay = "127.0.0.1:0", hc, 0
	if pub, err = server.New(cfg); err != nil {
		b.Fatal(err)
	}
	if err := lc.Start(ctx); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = lc.Drain(ctx); _ = pub.Drain(ctx) })

	return pub
}

// serveGuardedControl serves, until the benchmark ends, a control socket
// whose guard lets this process's user call grpc.testing.TestService 100
// times a second, and returns the socket's path.
func serveGuardedControl(ctx context.Context, b *testing.B) string {
	sock := filepath.Join(b.TempDir(), "control.sock")
	lis, _, err := control.Listen(ctx, sock, control.SocketOptions{GID: -1})
	if err != nil {
		b.Fatal(err)
	}
	rule, err := control.ParseRule(fmt.Sprintf("uid:%d=*", os.Getuid()), false)
	if err != nil {
		b.Fatal(err)
	}
	g, err := control.NewGuard(&control.AccessPolicy{Rate: 100, Rules: []control.Rule{rule}},
		control.GuardOptions{Service: "grpc.testing.TestService", Mutating: []string{"EmptyCall"}, Surface: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	ctl, err := server.New(server.Config{Listener: lis, StopTimeout: time.Second,
		GRPCOptions: []grpc.ServerOption{grpc.ChainUnaryInterceptor(g.Intercept)}})
	if err != nil {
		b.Fatal(err)
	}
	if err := ctl.Declare(&testpb.TestService_ServiceDesc); err != nil {
		b.Fatal(err)
	}
	if err := ctl.Bind("grpc.testing.TestService", guarded{}); err != nil {
		b.Fatal(err)
	}
	if err := ctl.Serve(ctx); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = ctl.Drain(ctx) })

	return sock
}

// dialBench is a client of target, closed when the benchmark ends.
func dialBench(b *testing.B, target string) *grpc.ClientConn {
	c, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	return c
}

// floodControl calls flooder from four goroutines without pause until
// stop, which returns how many calls were made.
func floodControl(ctx context.Context, flooder testpb.TestServiceClient) (stop func() int64) {
	done := make(chan struct{})
	var calls atomic.Int64
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				_, _ = flooder.UnaryCall(ctx, &testpb.SimpleRequest{})
				calls.Add(1)
			}
		})
	}
	return func() int64 { close(done); wg.Wait(); return calls.Load() }
}
