package server_test

// Benchmarks behind docs/benchmarks/server.md. Reproduce with:
//
//	go test -run '^$' -bench . -benchtime 10000x -count 3 ./server/
//
// Each load benchmark runs 16 concurrent clients over loopback on the same
// 2-core machine as the server, so its figures are meant side by side: a
// comparison runs its variants in alternating rounds within one benchmark
// and reports their ratio.

import (
	"context"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	grpchealth "google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	testpb "google.golang.org/grpc/interop/grpc_testing"

	"github.com/phasegate/phasegate/health"
	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/server"
)

const benchWorkers = 16

// run makes n calls of op over benchWorkers goroutines and returns their
// latencies and the wall time they took.
func run(b *testing.B, n int, op func(context.Context) error) ([]time.Duration, time.Duration) {
	b.Helper()
	ctx := context.Background()
	var next atomic.Int64
	lat := make([][]time.Duration, benchWorkers)
	errs := make(chan error, benchWorkers)
	var wg sync.WaitGroup
	begin := time.Now()
	for w := range benchWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mine := make([]time.Duration, 0, n/benchWorkers+1)
			for next.Add(1) <= int64(n) {
				t0 := time.Now()
				if err := op(ctx); err != nil {
					errs <- err
					return
				}
				mine = append(mine, time.Since(t0))
			}
			lat[w] = mine
		}()
	}
	wg.Wait()
	elapsed := time.Since(begin)
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	return slices.Concat(lat...), elapsed
}

// benchConfig is the recommended configuration without the drain delay,
// which benchmarks have no checker to wait for.
func benchConfig(addr string, hc *health.Checker, lc *lifecycle.Lifecycle) server.Config {
	cfg := server.DefaultConfig()
	cfg.Addr, cfg.Health, cfg.Gate, cfg.DrainDelay = addr, hc, server.LifecycleGate(lc), 0
	return cfg
}

// variant is one side of a side-by-side benchmark.
type variant struct {
	name    string
	op      func(context.Context) error
	lat     []time.Duration
	elapsed time.Duration
}

// load runs b.N calls of op and reports throughput and latency
// percentiles.
func load(b *testing.B, op func(context.Context) error) {
	b.Helper()
	sideBySide(b, &variant{name: "", op: op})
}

// sideBySide runs b.N calls against each variant, in alternating rounds
// (ABBA order) so that a change in the machine's load while the benchmark
// runs affects every variant alike, and reports each one's calls/s, p50
// and p99, and the ratios of the last variant to the first.
func sideBySide(b *testing.B, vs ...*variant) {
	b.Helper()
	for _, v := range vs { // warm up connections and code paths
		run(b, 200, v.op)
	}
	const rounds = 10
	per := max(b.N/rounds, 1)
	b.ResetTimer()
	for r := range rounds {
		order := slices.Clone(vs)
		if r%2 == 1 {
			slices.Reverse(order)
		}
		for _, v := range order {
			lat, el := run(b, per, v.op)
			v.lat = append(v.lat, lat...)
			v.elapsed += el
		}
	}
	b.StopTimer()
	type figures struct{ rate, p50, p99 float64 }
	fs := make([]figures, len(vs))
	for i, v := range vs {
		slices.Sort(v.lat)
		fs[i] = figures{
			rate: float64(len(v.lat)) / v.elapsed.Seconds(),
			p50:  float64(percentile(v.lat, 50)) / 1e3,
			p99:  float64(percentile(v.lat, 99)) / 1e3,
		}
		prefix := v.name
		if prefix != "" {
			prefix += "-"
		}
		b.ReportMetric(fs[i].rate, prefix+"calls/s")
		b.ReportMetric(fs[i].p50, prefix+"p50-µs")
		b.ReportMetric(fs[i].p99, prefix+"p99-µs")
	}
	if len(vs) > 1 {
		first, last := fs[0], fs[len(fs)-1]
		b.ReportMetric(last.rate/first.rate, "throughput-ratio")
		b.ReportMetric(last.p99/first.p99, "p99-ratio")
	}
	b.ReportMetric(0, "ns/op") // b.N calls per variant: ns/op would mislead
}

func percentile(sorted []time.Duration, p int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[(len(sorted)-1)*p/100]
}

// servingStack is a lifecycle that serves at once behind a phasegate
// server on a loopback port.
func servingStack(b *testing.B, declare bool) (*server.Server, *lifecycle.Lifecycle) {
	b.Helper()
	var srv *server.Server
	lc, err := lifecycle.New([]lifecycle.Phase{{
		Name: "listen",
		Run:  func(ctx context.Context, _ *lifecycle.Progress) error { return srv.Serve(ctx) },
	}})
	if err != nil {
		b.Fatal(err)
	}
	hc := health.New(lc, health.Options{})
	srv, err = server.New(benchConfig("127.0.0.1:0", hc, lc))
	if err != nil {
		b.Fatal(err)
	}
	if declare {
		if err := srv.Declare(&testpb.TestService_ServiceDesc); err != nil {
			b.Fatal(err)
		}
	}
	b.Cleanup(func() {
		_ = lc.Drain(context.Background())
		_ = srv.Drain(context.Background())
		hc.Close()
	})
	return srv, lc
}

func dialBench(b *testing.B, addr string) *grpc.ClientConn {
	b.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = conn.Close() })
	return conn
}

// BenchmarkHealthCheck compares grpc.health.v1 Check through phasegate's
// multiplexed port with grpc-go's stock health server on a plain listener.
func BenchmarkHealthCheck(b *testing.B) {
	check := func(conn *grpc.ClientConn) func(context.Context) error {
		c := healthpb.NewHealthClient(conn)
		return func(ctx context.Context) error {
			resp, err := c.Check(ctx, &healthpb.HealthCheckRequest{})
			if err == nil && resp.Status != healthpb.HealthCheckResponse_SERVING {
				b.Fatalf("status %v", resp.Status)
			}
			return err
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	gs := grpc.NewServer()
	healthpb.RegisterHealthServer(gs, grpchealth.NewServer())
	done := make(chan struct{})
	go func() { defer close(done); _ = gs.Serve(l) }()
	b.Cleanup(func() { gs.Stop(); <-done })

	srv, lc := servingStack(b, false)
	if err := lc.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	sideBySide(b,
		&variant{name: "stock", op: check(dialBench(b, l.Addr().String()))},
		&variant{name: "phasegate", op: check(dialBench(b, srv.Addr().String()))},
	)
}

// BenchmarkHTTPHealth measures GET /health (application/health+json)
// through phasegate's multiplexed port, and the same handler on a plain
// net/http server for the cost of the multiplexer.
func BenchmarkHTTPHealth(b *testing.B) {
	get := func(url string) func(context.Context) error {
		tr := &http.Transport{MaxIdleConnsPerHost: benchWorkers}
		b.Cleanup(tr.CloseIdleConnections)
		client := &http.Client{Transport: tr}
		return func(context.Context) error {
			resp, err := client.Get(url)
			if err != nil {
				return err
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				b.Fatalf("GET /health = %d", resp.StatusCode)
			}
			return nil
		}
	}
	plain, phasegate := healthServers(b)
	sideBySide(b,
		&variant{name: "plain", op: get("http://" + plain + "/health")},
		&variant{name: "phasegate", op: get("http://" + phasegate + "/health")},
	)
}

// BenchmarkUnavailableBeforeBind measures how fast a call to a declared,
// unbound service is refused while startup is held open.
func BenchmarkUnavailableBeforeBind(b *testing.B) {
	var srv *server.Server
	hold := make(chan struct{})
	lc, err := lifecycle.New([]lifecycle.Phase{
		{Name: "listen", Run: func(ctx context.Context, _ *lifecycle.Progress) error { return srv.Serve(ctx) }},
		{Name: "reclaim", Run: func(ctx context.Context, p *lifecycle.Progress) error {
			p.SetTotal(5000, "namespaces")
			p.SetDone(1200)
			select {
			case <-hold:
			case <-ctx.Done():
			}
			return nil
		}},
	})
	if err != nil {
		b.Fatal(err)
	}
	hc := health.New(lc, health.Options{})
	srv, err = server.New(benchConfig("127.0.0.1:0", hc, lc))
	if err != nil {
		b.Fatal(err)
	}
	if err := srv.Declare(&testpb.TestService_ServiceDesc); err != nil {
		b.Fatal(err)
	}
	started := make(chan error, 1)
	go func() { started <- lc.Start(context.Background()) }()
	b.Cleanup(func() {
		close(hold)
		<-started
		_ = lc.Drain(context.Background())
		_ = srv.Drain(context.Background())
		hc.Close()
	})
	for srv.Addr() == nil || lc.Snapshot().Phases[0].State != lifecycle.PhaseSucceeded {
		time.Sleep(time.Millisecond)
	}
	tc := testpb.NewTestServiceClient(dialBench(b, srv.Addr().String()))
	load(b, func(ctx context.Context) error {
		if _, err := tc.EmptyCall(ctx, &testpb.Empty{}); err == nil {
			b.Fatal("call succeeded before bind")
		}
		return nil
	})
}

// BenchmarkStartToAccepting measures, per iteration, a fresh lifecycle
// from Start to the listen phase having bound and served the port
// ("bound") and to the first HTTP answer on it ("answered"), while another
// phase holds startup open.
//
// Every iteration binds the same port, as a daemon does: binding port 0
// afresh each time would measure the kernel's search for a free port among
// the thousands of TIME_WAIT sockets the earlier iterations left.
func BenchmarkStartToAccepting(b *testing.B) {
	pick, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	addr := pick.Addr().String()
	_ = pick.Close()

	tr := &http.Transport{DisableKeepAlives: true}
	b.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr, Timeout: wait}
	bound := make([]time.Duration, 0, b.N)
	answered := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		var srv *server.Server
		var lc *lifecycle.Lifecycle
		listening, hold := make(chan time.Time, 1), make(chan struct{})
		lc, err = lifecycle.New([]lifecycle.Phase{
			{Name: "lock", Run: func(context.Context, *lifecycle.Progress) error { return nil }},
			{Name: "listen", DependsOn: []string{"lock"}, Run: func(ctx context.Context, _ *lifecycle.Progress) error {
				if err := srv.Serve(ctx); err != nil {
					return err
				}
				listening <- time.Now()
				return nil
			}},
			{Name: "reclaim", DependsOn: []string{"lock"}, Run: func(ctx context.Context, _ *lifecycle.Progress) error {
				select {
				case <-hold:
				case <-ctx.Done():
				}
				return nil
			}},
		})
		if err != nil {
			b.Fatal(err)
		}
		hc := health.New(lc, health.Options{})
		srv, err = server.New(benchConfig(addr, hc, lc))
		if err != nil {
			b.Fatal(err)
		}
		started := make(chan error, 1)
		b.StartTimer()

		t0 := time.Now()
		go func() { started <- lc.Start(context.Background()) }()
		t1 := <-listening
		resp, err := client.Get("http://" + srv.Addr().String() + "/health")
		if err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()

		b.StopTimer()
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable {
			b.Fatalf("GET /health while starting = %d", resp.StatusCode)
		}
		bound = append(bound, t1.Sub(t0))
		answered = append(answered, t2.Sub(t0))
		close(hold)
		<-started
		_ = lc.Drain(context.Background())
		_ = srv.Drain(context.Background())
		hc.Close()
		b.StartTimer()
	}
	b.StopTimer()
	slices.Sort(bound)
	slices.Sort(answered)
	b.ReportMetric(float64(percentile(bound, 50))/1e6, "bound-p50-ms")
	b.ReportMetric(float64(percentile(answered, 50))/1e6, "answered-p50-ms")
	b.ReportMetric(float64(percentile(answered, 99))/1e6, "answered-p99-ms")
}

// healthServers serves /health of one started lifecycle twice: on a bare
// net/http server and on phasegate's port. It returns their addresses,
// the baseline's first.
func healthServers(b *testing.B) (plain, phasegate string) {
	b.Helper()
	srv, lc := servingStack(b, false)
	if err := lc.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	hc := health.New(lc, health.Options{})
	b.Cleanup(hc.Close)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	hs := &http.Server{Handler: health.NewHandler(hc), ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() { defer close(done); _ = hs.Serve(l) }()
	b.Cleanup(func() { _ = hs.Close(); <-done })
	return l.Addr().String(), srv.Addr().String()
}
