package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// Request kinds of the load generator.
const (
	kindGRPC = "grpc"
	kindHTTP = "http"
)

// maxInFlight bounds the load generator's outstanding requests; a request
// due while that many are outstanding is counted as an error ("dropped").
// Every request also has a 2 s timeout, as a health checker would, so the
// bound is set above rate × timeout at the rates used (5,000/s): a check
// then fails only when the daemon does not answer it in time, not because
// a short stall filled an arbitrary queue on the client's side.
const maxInFlight = 16384

// sample is one request of the load generator.
type sample struct {
	Kind string `json:"k"`
	// At is when the request was sent (Unix ns).
	At int64 `json:"at"`
	// Latency is from send to the complete answer (ns).
	Latency int64 `json:"lat"`
	// Err is empty for an answer (gRPC SERVING/NOT_SERVING, HTTP 200/503).
	Err string `json:"err,omitempty"`
}

// loadgenMain is the `loadgen` subcommand: it waits for the port, then
// sends gRPC Check and HTTP GET /health alternately at a fixed rate to
// 127.0.0.1 until -duration has passed or it receives SIGINT/SIGTERM, waits
// for the outstanding requests and writes the samples as JSON to -out.
func loadgenMain(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("loadgen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "", "127.0.0.1:port of the daemon")
	rate := fs.Int("rate", 2000, "requests per second (both kinds together)")
	duration := fs.Duration("duration", 10*time.Second, "longest run once the port answers")
	wait := fs.Duration("wait", 30*time.Second, "longest wait for the port")
	out := fs.String("out", "", "file for the samples (JSON)")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	host, _, err := net.SplitHostPort(*addr)
	if err != nil || host != "127.0.0.1" || *out == "" || *rate < 1 || *duration <= 0 || *duration > 5*time.Minute {
		fmt.Fprintln(stderr, "loadgen: need -addr 127.0.0.1:port, -out, a rate ≥ 1 and a duration in (0, 5m]")
		return exitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := waitPort(ctx, *addr, *wait); err != nil {
		fmt.Fprintln(stderr, "loadgen:", err)
		return exitError
	}
	samples, err := generate(ctx, *addr, *rate, *duration)
	if err != nil {
		fmt.Fprintln(stderr, "loadgen:", err)
		return exitError
	}
	b, err := json.Marshal(samples)
	if err == nil {
		err = os.WriteFile(*out, b, 0o600)
	}
	if err != nil {
		fmt.Fprintln(stderr, "loadgen:", err)
		return exitError
	}
	return exitOK
}

// waitPort dials addr every millisecond until it accepts.
func waitPort(ctx context.Context, addr string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			return c.Close()
		}
		if err := sleep(ctx, time.Millisecond); err != nil {
			return fmt.Errorf("port %s never accepted: %w", addr, err)
		}
	}
}

// generate sends requests on a fixed schedule (open loop: a slow answer does
// not delay the next request) until duration has passed or ctx ends, then
// waits for the outstanding ones.
func generate(ctx context.Context, addr string, rate int, duration time.Duration) ([]sample, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("grpc client: %w", err)
	}
	defer conn.Close()
	health := healthpb.NewHealthClient(conn)
	httpClient := &http.Client{
		Timeout:   2 * time.Second,
		Transport: &http.Transport{MaxIdleConnsPerHost: maxInFlight},
	}
	defer httpClient.CloseIdleConnections()
	url := "http://" + addr + "/health"

	var (
		mu      sync.Mutex
		samples = make([]sample, 0, int(float64(rate)*duration.Seconds())+1)
		wg      sync.WaitGroup
		slots   = make(chan struct{}, maxInFlight)
	)
	record := func(s sample) {
		mu.Lock()
		samples = append(samples, s)
		mu.Unlock()
	}
	interval := time.Second / time.Duration(rate)
	start := time.Now()
	timer := time.NewTimer(0)
	defer timer.Stop()
	for k := 0; ; k++ {
		due := start.Add(time.Duration(k) * interval)
		if due.Sub(start) >= duration {
			break
		}
		timer.Reset(max(time.Until(due), 0))
		select {
		case <-ctx.Done():
		case <-timer.C:
		}
		if ctx.Err() != nil {
			break
		}
		kind := kindGRPC
		if k%2 == 1 {
			kind = kindHTTP
		}
		select {
		case slots <- struct{}{}:
		default:
			record(sample{Kind: kind, At: time.Now().UnixNano(), Err: "dropped: too many outstanding"})
			continue
		}
		wg.Go(func() {
			defer func() { <-slots }()
			if kind == kindGRPC {
				record(checkGRPC(health))
			} else {
				record(getHTTP(httpClient, url))
			}
		})
	}
	wg.Wait()
	return samples, nil
}

// checkGRPC does one grpc.health.v1 Check of service "".
func checkGRPC(health healthpb.HealthClient) sample {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	t0 := time.Now()
	resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{})
	s := sample{Kind: kindGRPC, At: t0.UnixNano(), Latency: int64(time.Since(t0))}
	switch {
	case err != nil:
		s.Err = err.Error()
	case resp.GetStatus() != healthpb.HealthCheckResponse_SERVING &&
		resp.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING:
		s.Err = "status " + resp.GetStatus().String()
	}
	return s
}

// getHTTP does one GET /health.
func getHTTP(client *http.Client, url string) sample {
	t0 := time.Now()
	s := sample{Kind: kindHTTP, At: t0.UnixNano()}
	resp, err := client.Get(url)
	if err == nil {
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	s.Latency = int64(time.Since(t0))
	switch {
	case err != nil:
		s.Err = err.Error()
	case resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusServiceUnavailable:
		s.Err = "status " + resp.Status
	}
	return s
}

// loadgen is a running load-generator process.
type loadgen struct {
	cmd  *exec.Cmd
	out  string
	done chan struct{}
	err  error
	logs *logTail
}

// startLoadgen re-execs this binary as `loadgen` against addr.
func startLoadgen(dir, addr string, rate int, duration time.Duration) (*loadgen, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("loadgen: %w", err)
	}
	f, err := os.CreateTemp(dir, "load-*.json")
	if err != nil {
		return nil, fmt.Errorf("loadgen: %w", err)
	}
	f.Close()
	g := &loadgen{out: f.Name(), done: make(chan struct{}), logs: newLogTail(50)}
	g.cmd = exec.Command(self, "loadgen", "-addr", addr, "-rate", fmt.Sprint(rate),
		"-duration", duration.String(), "-out", g.out)
	g.cmd.Stdout, g.cmd.Stderr = g.logs, g.logs
	if err := g.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start loadgen: %w", err)
	}
	go func() {
		g.err = g.cmd.Wait()
		close(g.done)
	}()
	return g, nil
}

// finish asks the load generator to stop now (interrupt=true) or waits for
// its duration to end, then reads its samples.
func (g *loadgen) finish(interrupt bool, timeout time.Duration) ([]sample, error) {
	if interrupt {
		_ = g.cmd.Process.Signal(syscall.SIGINT)
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-g.done:
	case <-t.C:
		g.kill()
		return nil, fmt.Errorf("loadgen did not finish within %v\n%s", timeout, g.logs)
	}
	defer os.Remove(g.out)
	if g.err != nil {
		return nil, fmt.Errorf("loadgen: %w\n%s", g.err, g.logs)
	}
	b, err := os.ReadFile(g.out)
	if err != nil {
		return nil, fmt.Errorf("loadgen output: %w", err)
	}
	var samples []sample
	if err := json.Unmarshal(b, &samples); err != nil {
		return nil, fmt.Errorf("loadgen output: %w", err)
	}
	if len(samples) == 0 {
		return nil, errors.New("loadgen sent no request")
	}
	return samples, nil
}

// kill ends the process at once and waits for it.
func (g *loadgen) kill() {
	_ = g.cmd.Process.Kill()
	<-g.done
}
