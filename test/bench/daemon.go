package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// buildPhasegate builds ./cmd/phasegate (without -race) into dir.
func buildPhasegate(ctx context.Context, dir string) (string, error) {
	bin := filepath.Join(dir, "phasegate")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/phasegate/phasegate/cmd/phasegate")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/phasegate: %w\n%s", err, out)
	}
	return bin, nil
}

// freeAddr returns a loopback address whose port nobody listens on now.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("free port: %w", err)
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// daemon is a running phasegate process.
type daemon struct {
	cmd   *exec.Cmd
	addr  string
	began time.Time
	done  chan struct{} // closed when the process has exited
	err   error         // Wait's result, set before done is closed
	logs  *logTail
}

// daemonArgs returns the serve flags confining a daemon to h.
func daemonArgs(h *host, addr string, o options, serial bool) []string {
	args := []string{
		"serve",
		"--listen=" + addr,
		"--state-dir=" + h.stateDir,
		"--netns-dir=" + h.cfg.NetnsDir,
		"--slot-prefix=" + h.cfg.Prefix,
		"--slots=" + strconv.Itoa(h.cfg.Slots),
		"--slot-cidr=" + h.cfg.CIDR.String(),
		"--reclaim-workers=" + strconv.Itoa(o.workers),
		"--pool-size=" + strconv.Itoa(o.poolSize),
		"--pool-min-ready=1",
		"--drain-delay=20ms",
		"--stop-timeout=5s",
		"--log-format=json",
	}
	if serial {
		args = append(args, "--serial-baseline")
	}
	return args
}

// startDaemon execs bin with args; began is taken right before the exec.
func startDaemon(bin string, args []string) (*daemon, error) {
	d := &daemon{
		cmd:  exec.Command(bin, args...),
		done: make(chan struct{}),
		logs: newLogTail(200),
	}
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--listen="); ok {
			d.addr = v
		}
	}
	d.cmd.Stdout, d.cmd.Stderr = d.logs, d.logs
	d.began = time.Now()
	if err := d.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start phasegate: %w", err)
	}
	go func() {
		d.err = d.cmd.Wait()
		close(d.done)
	}()
	return d, nil
}

// stop sends SIGTERM (the daemon drains and destroys its pool) and waits up
// to 30 s before killing it. It returns an error when the daemon did not
// exit cleanly.
func (d *daemon) stop() error {
	select {
	case <-d.done:
		return d.exitErr("exited before it was stopped")
	default:
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(30 * time.Second)
	defer t.Stop()
	select {
	case <-d.done:
		return d.exitErr("drain")
	case <-t.C:
		_ = d.cmd.Process.Kill()
		<-d.done
		return fmt.Errorf("phasegate did not stop within 30 s of SIGTERM; killed\n%s", d.logs)
	}
}

// kill ends the process at once (used on the error path) and waits for it.
func (d *daemon) kill() {
	_ = d.cmd.Process.Kill()
	<-d.done
}

func (d *daemon) exitErr(what string) error {
	if d.err != nil {
		return fmt.Errorf("phasegate %s: %w\n%s", what, d.err, d.logs)
	}
	if what != "drain" {
		return fmt.Errorf("phasegate %s\n%s", what, d.logs)
	}
	return nil
}

// startup is what one start of the daemon measured.
type startup struct {
	FirstAnswer time.Duration // exec → first HTTP response on /health
	FirstStatus int           // that response's status code
	FirstGRPC   time.Duration // exec → first message on the health Watch stream
	FirstGRPCSt string        // that message's status
	Serving     time.Duration // exec → SERVING on the Watch stream
}

// measureStartup waits until the daemon serves (or exits, or timeout) and
// returns the times of the first HTTP answer, the first gRPC health answer
// and SERVING, all from the exec.
func (d *daemon) measureStartup(ctx context.Context, timeout time.Duration) (startup, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	go func() {
		select {
		case <-d.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	var (
		su      startup
		wg      sync.WaitGroup
		httpErr error
		grpcErr error
	)
	wg.Go(func() {
		var at time.Time
		su.FirstStatus, at, httpErr = firstHTTPAnswer(ctx, d.addr)
		su.FirstAnswer = at.Sub(d.began)
	})
	wg.Go(func() {
		var first, serving time.Time
		su.FirstGRPCSt, first, serving, grpcErr = watchUntilServing(ctx, d.addr)
		su.FirstGRPC, su.Serving = first.Sub(d.began), serving.Sub(d.began)
	})
	wg.Wait()
	select {
	case <-d.done:
		return su, d.exitErr("exited during startup")
	default:
	}
	if err := errors.Join(httpErr, grpcErr); err != nil {
		return su, fmt.Errorf("waiting for phasegate to serve: %w\n%s", err, d.logs)
	}
	return su, nil
}

// firstHTTPAnswer polls GET /health on new connections until any HTTP
// response arrives: every millisecond for the first second, then every 5 ms.
func firstHTTPAnswer(ctx context.Context, addr string) (int, time.Time, error) {
	client := &http.Client{
		Timeout:   2 * time.Second,
		Transport: &http.Transport{DisableKeepAlives: true},
	}
	defer client.CloseIdleConnections()
	start := time.Now()
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/health", nil)
		if err != nil {
			return 0, time.Time{}, err
		}
		resp, err := client.Do(req)
		if err == nil {
			at := time.Now()
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			return resp.StatusCode, at, nil
		}
		interval := time.Millisecond
		if time.Since(start) > time.Second {
			interval = 5 * time.Millisecond
		}
		if err := sleep(ctx, interval); err != nil {
			return 0, time.Time{}, fmt.Errorf("no HTTP answer: %w", err)
		}
	}
}

// watchUntilServing opens a grpc.health.v1 Watch on service "" (waiting for
// the port with a fast reconnect backoff: 1 ms doubling to 20 ms) and
// returns the first status received, when it arrived and when SERVING
// arrived.
func watchUntilServing(ctx context.Context, addr string) (string, time.Time, time.Time, error) {
	conn, err := grpc.NewClient(addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: time.Millisecond, Multiplier: 2, Jitter: 0.1, MaxDelay: 20 * time.Millisecond},
			MinConnectTimeout: 2 * time.Second,
		}))
	if err != nil {
		return "", time.Time{}, time.Time{}, fmt.Errorf("grpc client: %w", err)
	}
	defer conn.Close()
	client := healthpb.NewHealthClient(conn)
	var (
		firstStatus string
		first       time.Time
	)
	for {
		stream, err := client.Watch(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
		if err != nil {
			return firstStatus, first, time.Time{}, fmt.Errorf("health Watch: %w", err)
		}
		for {
			resp, err := stream.Recv()
			if err != nil {
				if ctx.Err() != nil {
					return firstStatus, first, time.Time{}, fmt.Errorf("health Watch: %w", ctx.Err())
				}
				break // the stream broke: watch again
			}
			now := time.Now()
			if first.IsZero() {
				first, firstStatus = now, resp.GetStatus().String()
			}
			if resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
				return firstStatus, first, now, nil
			}
		}
	}
}

// lifecycleView is the part of GET /debug/lifecycle the benchmark reads.
type lifecycleView struct {
	State  string      `json:"state"`
	Phases []phaseView `json:"phases"`
	Tasks  []phaseView `json:"tasks"`
}

type phaseView struct {
	Name    string    `json:"name"`
	State   string    `json:"state"`
	Started time.Time `json:"started"`
	Ended   time.Time `json:"ended"`
}

// lifecycle fetches GET /debug/lifecycle.
func (d *daemon) lifecycle(ctx context.Context) (lifecycleView, error) {
	var v lifecycleView
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+d.addr+"/debug/lifecycle", nil)
	if err != nil {
		return v, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return v, fmt.Errorf("GET /debug/lifecycle: %w", err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		return v, fmt.Errorf("GET /debug/lifecycle: %w", err)
	}
	return v, nil
}

// waitPoolFilled polls the lifecycle until the background pool fill is no
// longer running (up to a minute) and returns the last view.
func (d *daemon) waitPoolFilled(ctx context.Context) (lifecycleView, error) {
	deadline := time.Now().Add(time.Minute)
	for {
		v, err := d.lifecycle(ctx)
		if err != nil {
			return v, err
		}
		filling := false
		for _, t := range v.Tasks {
			if t.Name == "fill" && (t.State == "running" || t.State == "pending") {
				filling = true
			}
		}
		if !filling {
			return v, nil
		}
		if time.Now().After(deadline) {
			return v, errors.New("the pool did not fill within a minute")
		}
		if err := sleep(ctx, 50*time.Millisecond); err != nil {
			return v, err
		}
	}
}

// memory reads the process's VmRSS and VmHWM (peak RSS) in bytes.
func (d *daemon) memory() (rss, hwm int64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", d.cmd.Process.Pid))
	if err != nil {
		return 0, 0, fmt.Errorf("read RSS: %w", err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		key, val, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		kb, perr := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(val), " kB"), 10, 64)
		switch key {
		case "VmRSS":
			rss, err = kb*1024, perr
		case "VmHWM":
			hwm = kb * 1024
		}
	}
	return rss, hwm, err
}

// reclaimReport is the daemon's "reclaim report" log line.
type reclaimReport struct {
	Found     int           `json:"found"`
	Reclaimed int           `json:"reclaimed"`
	Failed    int           `json:"failed"`
	CutOff    int           `json:"cut_off"`
	Duration  time.Duration `json:"-"`
	RawDur    string        `json:"duration"`
}

// reclaimReport finds and parses the daemon's reclaim report in its JSON log.
func (d *daemon) reclaimReport() (reclaimReport, error) {
	for _, line := range d.logs.lines() {
		var r struct {
			Msg string `json:"msg"`
			reclaimReport
		}
		if json.Unmarshal([]byte(line), &r) != nil || r.Msg != "reclaim report" {
			continue
		}
		dur, err := time.ParseDuration(r.RawDur)
		if err != nil {
			return r.reclaimReport, fmt.Errorf("reclaim report duration %q: %w", r.RawDur, err)
		}
		r.Duration = dur
		return r.reclaimReport, nil
	}
	return reclaimReport{}, fmt.Errorf("no reclaim report in the log\n%s", d.logs)
}

// logTail keeps the reclaim report lines and the last n lines of a
// process's output.
type logTail struct {
	mu      sync.Mutex
	partial []byte
	kept    []string
	last    []string
	n       int
}

func newLogTail(n int) *logTail { return &logTail{n: n} }

// Write implements io.Writer.
func (l *logTail) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.partial = append(l.partial, p...)
	complete := strings.LastIndexByte(string(l.partial), '\n')
	if complete < 0 {
		return len(p), nil
	}
	for _, line := range strings.Split(string(l.partial[:complete]), "\n") {
		if strings.Contains(line, `"reclaim report"`) {
			l.kept = append(l.kept, line)
		}
		l.last = append(l.last, line)
		if len(l.last) > l.n {
			l.last = l.last[len(l.last)-l.n:]
		}
	}
	l.partial = append(l.partial[:0], l.partial[complete+1:]...)
	return len(p), nil
}

// lines returns the kept lines followed by the last lines.
func (l *logTail) lines() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append(append([]string(nil), l.kept...), l.last...)
}

// String returns the last lines, for error messages.
func (l *logTail) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.last, "\n")
}
