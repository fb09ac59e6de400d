package main

import (
	"context"
	"crypto/tls"
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
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
)

// Request kinds of the load generator.
const (
	kindGRPC    = "grpc"
	kindHTTP    = "http"
	kindAcquire = "acquire"
)

// Load generator modes.
const (
	// genHealth alternates gRPC Check and HTTP GET /health, on one gRPC
	// connection and keep-alive HTTP connections: a health checker's load.
	genHealth = "health"
	// genAcquire calls Slots.Acquire, each with its own request id, on the
	// daemon's control socket (-control).
	genAcquire = "acquire"
	// genProbe alternates HTTP GET /health and gRPC Check, each on a new
	// TCP connection: what an orchestrator's checks and new clients see.
	genProbe = "probe"
	// genChecker probes the way real health checkers do: HTTP GET
	// /health on a new TCP connection each (-http-rate), and gRPC Check
	// on one kept connection (-grpc-rate, to -grpc-addr), each on its own
	// schedule.
	genChecker = "checker"
)

// Outcomes of a probe beyond an answer.
const (
	outRefused = "refused"
	outFailed  = "failed"
)

// maxInFlight bounds the load generator's outstanding requests; a request
// due while that many are outstanding is counted as an error ("dropped").
// Every request also has a timeout, as a health checker would, so the
// bound is set above rate × timeout at the rates used (5,000/s): a check
// then fails only when the daemon does not answer it in time, not because
// a short stall filled an arbitrary queue on the client's side.
const maxInFlight = 16384

// sample is one request of the load generator.
type sample struct {
	Kind string `json:"k"`
	// At is when the request was sent (Unix ns).
	At int64 `json:"at"`
	// Lag is how late it was sent after its due time (ns): a generator
	// starved of CPU sends late, and then in bursts.
	Lag int64 `json:"lag,omitempty"`
	// Latency is from send to the complete answer (ns).
	Latency int64 `json:"lat"`
	// Answer is the status answered: SERVING, NOT_SERVING, 200, 503, OK
	// (an Acquire).
	Answer string `json:"a,omitempty"`
	// Err is empty for an answer; Out classifies an error of a probe:
	// refused (ECONNREFUSED) or failed (anything else).
	Err string `json:"err,omitempty"`
	Out string `json:"out,omitempty"`
	// Side is the daemon probed, when a probe generator has two (-addr2):
	// 0 for -addr, 1 for -addr2.
	Side int `json:"side,omitempty"`
}

// loadgenMain is the `loadgen` subcommand: it waits for the port, then
// sends requests of its mode at a fixed rate to 127.0.0.1 until -duration
// has passed or it receives SIGINT/SIGTERM, waits for the outstanding
// requests and writes the samples as JSON to -out.
func loadgenMain(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("loadgen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "", "127.0.0.1:port of the daemon")
	grpcAddr := fs.String("grpc-addr", "", "where -mode health and checker send gRPC Check (default -addr)")
	control := fs.String("control", "", "the daemon's control socket, where -mode acquire calls the Slots API")
	mode := fs.String("mode", genHealth, "health, acquire, probe or checker")
	rate := fs.Int("rate", 2000, "requests per second")
	httpRate := fs.Int("http-rate", 20, "-mode checker: HTTP checks per second, each on a new connection")
	grpcRate := fs.Int("grpc-rate", 50, "-mode checker: gRPC Checks per second, on one kept connection")
	duration := fs.Duration("duration", 10*time.Second, "longest run once the port answers")
	wait := fs.Duration("wait", 30*time.Second, "longest wait for the port")
	out := fs.String("out", "", "file for the samples (JSON)")
	ca := fs.String("tls-cert", "", "-mode probe: the daemon's self-signed certificate (its --tls-cert): probe with TLS, trusting it alone")
	addr2 := fs.String("addr2", "", "-mode probe: a second daemon (127.0.0.1:port); the probes go to -addr and to it in turn, a -slot each, in ABBA order")
	slot := fs.Duration("slot", 500*time.Millisecond, "-mode probe with -addr2: how long the probes go to one daemon before the other")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	host, _, err := net.SplitHostPort(*addr)
	if *grpcAddr == "" {
		*grpcAddr = *addr
	}
	grpcHost, _, gerr := net.SplitHostPort(*grpcAddr)
	if err != nil || gerr != nil || host != "127.0.0.1" || grpcHost != "127.0.0.1" || *out == "" || *rate < 1 || *httpRate < 1 || *grpcRate < 1 ||
		*duration <= 0 || *duration > 10*time.Minute ||
		(*mode != genHealth && *mode != genAcquire && *mode != genProbe && *mode != genChecker) || (*mode == genAcquire && *control == "") ||
		((*ca != "" || *addr2 != "") && *mode != genProbe) || *slot <= 0 || (*addr2 != "" && !strings.HasPrefix(*addr2, "127.0.0.1:")) {
		fmt.Fprintln(stderr, "loadgen: need -addr (and -grpc-addr, -addr2) 127.0.0.1:port, -out, -mode health|acquire|probe|checker (acquire with -control SOCKET; -tls-cert and -addr2 with probe only), rates ≥ 1, a -slot > 0 and a duration in (0, 10m]")
		return exitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := waitPort(ctx, *addr, *wait); err != nil {
		fmt.Fprintln(stderr, "loadgen:", err)
		return exitError
	}
	var samples []sample
	switch {
	case *mode == genChecker:
		samples, err = check(ctx, *addr, *grpcAddr, *httpRate, *grpcRate, *duration)
	case *ca != "" || *addr2 != "":
		addrs := []string{*addr}
		if *addr2 != "" {
			addrs = append(addrs, *addr2)
		}
		samples, err = probeSides(ctx, addrs, *ca, *rate, *slot, *duration)
	default:
		samples, err = generate(ctx, *addr, *grpcAddr, *control, *mode, *rate, *duration)
	}
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
func generate(ctx context.Context, addr, grpcAddr, control, mode string, rate int, duration time.Duration) ([]sample, error) {
	send, closeAll, err := sender(addr, grpcAddr, control, mode)
	if err != nil {
		return nil, err
	}
	defer closeAll()
	return schedule(ctx, mode, send, rate, duration), nil
}

// check is -mode checker: HTTP checks on new connections to addr and gRPC
// Checks on one kept connection to grpcAddr, each at its rate on its own
// schedule, until duration has passed or ctx ends.
func check(ctx context.Context, addr, grpcAddr string, httpRate, grpcRate int, duration time.Duration) ([]sample, error) {
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("grpc client: %w", err)
	}
	defer conn.Close()
	health := healthpb.NewHealthClient(conn)
	var (
		wg         sync.WaitGroup
		gets, rpcs []sample
	)
	wg.Go(func() {
		gets = schedule(ctx, kindHTTP, func(int) sample { return probeHTTP(addr) }, httpRate, duration)
	})
	wg.Go(func() {
		rpcs = schedule(ctx, kindGRPC, func(int) sample { return checkGRPC(health) }, grpcRate, duration)
	})
	wg.Wait()
	return append(gets, rpcs...), nil
}

// schedule calls send at rate on a fixed schedule and returns the samples;
// a request due while maxInFlight are outstanding is counted as dropped,
// of kind.
func schedule(ctx context.Context, kind string, send func(k int) sample, rate int, duration time.Duration) []sample {
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
		select {
		case slots <- struct{}{}:
		default:
			record(sample{Kind: kind, At: time.Now().UnixNano(), Err: "dropped: too many outstanding", Out: outFailed})
			continue
		}
		lag := int64(time.Since(due))
		wg.Go(func() {
			defer func() { <-slots }()
			s := send(k)
			s.Lag = lag
			record(s)
		})
	}
	wg.Wait()
	return samples
}

// sender returns the function that sends the k-th request of mode, and
// what closes its connections. Acquire goes to the control socket at
// control (the daemon binds it before its port, so it is there once the
// port answers); the health mode's gRPC Checks to grpcAddr; the rest to
// addr.
func sender(addr, grpcAddr, control, mode string) (func(k int) sample, func(), error) {
	switch mode {
	case genProbe:
		return func(k int) sample {
			if k%2 == 0 {
				return probeHTTP(addr)
			}
			return probeGRPC(addr)
		}, func() {}, nil
	case genAcquire:
		conn, err := grpc.NewClient("unix://"+control, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return nil, nil, fmt.Errorf("grpc client: %w", err)
		}
		slots := phasegatev1.NewSlotsClient(conn)
		prefix := fmt.Sprintf("load-%d", os.Getpid())
		return func(k int) sample { return acquireOne(slots, fmt.Sprintf("%s-%d", prefix, k)) }, func() { conn.Close() }, nil
	}
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, fmt.Errorf("grpc client: %w", err)
	}
	health := healthpb.NewHealthClient(conn)
	httpClient := &http.Client{
		Timeout:   2 * time.Second,
		Transport: &http.Transport{MaxIdleConnsPerHost: maxInFlight},
	}
	url := "http://" + addr + "/health"
	return func(k int) sample {
			if k%2 == 0 {
				return checkGRPC(health)
			}
			return getHTTP(httpClient, url)
		}, func() {
			httpClient.CloseIdleConnections()
			conn.Close()
		}, nil
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
		s.Err, s.Out = err.Error(), outFailed
	case resp.GetStatus() != healthpb.HealthCheckResponse_SERVING &&
		resp.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING:
		s.Err, s.Out = "status "+resp.GetStatus().String(), outFailed
	default:
		s.Answer = resp.GetStatus().String()
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
		s.Err, s.Out = err.Error(), outFailed
	case resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusServiceUnavailable:
		s.Err, s.Out = "status "+resp.Status, outFailed
	default:
		s.Answer = fmt.Sprint(resp.StatusCode)
	}
	return s
}

// acquireOne calls Slots.Acquire once with its own request id.
func acquireOne(slots phasegatev1.SlotsClient, requestID string) sample {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	t0 := time.Now()
	_, err := slots.Acquire(ctx, &phasegatev1.AcquireRequest{Owner: "bench-load", RequestId: requestID})
	s := sample{Kind: kindAcquire, At: t0.UnixNano(), Latency: int64(time.Since(t0))}
	if err != nil {
		s.Err, s.Out = err.Error(), outFailed
	} else {
		s.Answer = "OK"
	}
	return s
}

// abba is the order in which probeSides gives its slots to two daemons:
// the first one goes first in every other pair, so that a drift of the
// machine's load over the window falls on both alike.
var abba = [4]int{0, 1, 1, 0}

// probeSides is -mode probe with TLS (trusting the certificate in
// certFile, when given) or to two daemons: the probes of genProbe, each on
// a new connection, to addrs[0] alone, or to addrs[0] and addrs[1] in
// turn, a slot of time each in ABBA order, each sample marked with its
// daemon's index.
func probeSides(ctx context.Context, addrs []string, certFile string, rate int, slot, duration time.Duration) ([]sample, error) {
	var cfg *tls.Config
	if certFile != "" {
		var err error
		if cfg, err = clientTLS(certFile); err != nil {
			return nil, err
		}
	}
	perSlot := max(1, int(float64(rate)*slot.Seconds()))
	return schedule(ctx, genProbe, func(k int) sample {
		side := 0
		if len(addrs) > 1 {
			side = abba[(k/perSlot)%len(abba)]
		}
		var s sample
		if k%2 == 0 {
			s = probeHTTPWith(addrs[side], cfg)
		} else {
			s = probeGRPCWith(addrs[side], cfg)
		}
		s.Side = side
		return s
	}, rate, duration), nil
}

// probeHTTP does one GET /health on a new connection.
func probeHTTP(addr string) sample { return probeHTTPWith(addr, nil) }

// probeHTTPWith does one GET /health on a new connection, with TLS when
// tlsCfg is not nil.
func probeHTTPWith(addr string, tlsCfg *tls.Config) sample {
	tr := &http.Transport{DisableKeepAlives: true, TLSClientConfig: tlsCfg}
	defer tr.CloseIdleConnections()
	s := getHTTP(&http.Client{Timeout: 2 * time.Second, Transport: tr}, baseURL(addr, tlsCfg)+"/health")
	if s.Err != "" && isRefused(s.Err) {
		s.Out = outRefused
	}
	return s
}

// probeGRPC does one grpc.health.v1 Check on a new connection, without
// waiting for the connection to become ready: a refused connection fails
// the call at once, as it does for a checker.
func probeGRPC(addr string) sample { return probeGRPCWith(addr, nil) }

// probeGRPCWith is probeGRPC, with TLS when tlsCfg is not nil.
func probeGRPCWith(addr string, tlsCfg *tls.Config) sample {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(transportCreds(tlsCfg)))
	if err != nil {
		return sample{Kind: kindGRPC, At: time.Now().UnixNano(), Err: err.Error(), Out: outFailed}
	}
	defer conn.Close()
	s := checkGRPC(healthpb.NewHealthClient(conn))
	if s.Err != "" && isRefused(s.Err) {
		s.Out = outRefused
	}
	return s
}

// isRefused reports whether an error says the connection was refused.
// gRPC reports the dial error in its status message only.
func isRefused(msg string) bool {
	return strings.Contains(msg, syscall.ECONNREFUSED.Error())
}

// loadgen is a running load-generator process.
type loadgen struct {
	cmd  *exec.Cmd
	out  string
	done chan struct{}
	err  error
	logs *logTail
}

// startLoadgen re-execs this binary as `loadgen` in mode against addr (and
// the control socket of a daemon on r.h) and tracks it.
func (r *runner) startLoadgen(addr, mode string, rate int, duration time.Duration, extra ...string) (*loadgen, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("loadgen: %w", err)
	}
	f, err := os.CreateTemp(r.h.base, "load-*.json")
	if err != nil {
		return nil, fmt.Errorf("loadgen: %w", err)
	}
	f.Close()
	g := &loadgen{out: f.Name(), done: make(chan struct{}), logs: newLogTail(50)}
	g.cmd = exec.Command(self, "loadgen", "-mode", mode, "-addr", addr, "-control", r.h.controlSocket(), "-rate", fmt.Sprint(rate),
		"-duration", duration.String(), "-out", g.out)
	g.cmd.Args = append(g.cmd.Args, extra...)
	g.cmd.Stdout, g.cmd.Stderr = g.logs, g.logs
	if err := g.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start loadgen: %w", err)
	}
	go func() {
		g.err = g.cmd.Wait()
		close(g.done)
	}()
	r.track(g.kill)
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
