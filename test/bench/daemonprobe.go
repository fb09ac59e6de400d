package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// startup is what one start of the daemon measured.
type startup struct {
	FirstAnswer time.Duration // exec → first HTTP response on /health
	FirstStatus int           // that response's status code
	FirstGRPC   time.Duration // exec → first message on the health Watch stream
	FirstGRPCSt string        // that message's status
	Serving     time.Duration // exec → SERVING on the Watch stream
	ServingAt   time.Time     // when SERVING arrived
	// Exec is when the (first) exec happened: the times above are from it.
	Exec time.Time
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
		su      = startup{Exec: d.began}
		wg      sync.WaitGroup
		httpErr error
		grpcErr error
	)
	wg.Go(func() {
		var at time.Time
		su.FirstStatus, at, httpErr = firstHTTPAnswer(ctx, d.addr, d.tlsClient)
		su.FirstAnswer = at.Sub(d.began)
	})
	wg.Go(func() {
		var first time.Time
		su.FirstGRPCSt, first, su.ServingAt, grpcErr = watchUntilServing(ctx, d.addr, d.tlsClient)
		su.FirstGRPC, su.Serving = first.Sub(d.began), su.ServingAt.Sub(d.began)
	})
	wg.Wait()
	if d.exited() {
		return su, d.exitErr("exited during startup")
	}
	if err := errors.Join(httpErr, grpcErr); err != nil {
		return su, fmt.Errorf("waiting for phasegate to serve: %w\n%s", err, d.logs)
	}
	return su, nil
}

// firstHTTPAnswer polls GET /health on new connections (with TLS, when
// tlsCfg is not nil) until any HTTP response arrives: every millisecond
// for the first second, then every 5 ms.
func firstHTTPAnswer(ctx context.Context, addr string, tlsCfg *tls.Config) (int, time.Time, error) {
	client := &http.Client{
		Timeout:   2 * time.Second,
		Transport: &http.Transport{DisableKeepAlives: true, TLSClientConfig: tlsCfg},
	}
	defer client.CloseIdleConnections()
	start := time.Now()
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, baseURL(addr, tlsCfg)+"/health", nil)
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
// the port with a fast reconnect backoff: 1 ms doubling to 20 ms; with TLS
// when tlsCfg is not nil) and returns the first status received, when it
// arrived and when SERVING arrived.
func watchUntilServing(ctx context.Context, addr string, tlsCfg *tls.Config) (string, time.Time, time.Time, error) {
	conn, err := grpc.NewClient(addr,
		grpc.WithTransportCredentials(transportCreds(tlsCfg)),
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

// task returns the background task named name, if the view has it.
func (v lifecycleView) task(name string) (phaseView, bool) {
	for _, t := range v.Tasks {
		if t.Name == name {
			return t, true
		}
	}
	return phaseView{}, false
}

// lifecycle fetches GET /debug/lifecycle.
func (d *daemon) lifecycle(ctx context.Context) (lifecycleView, error) {
	var v lifecycleView
	b, err := d.get(ctx, "/debug/lifecycle")
	if err == nil {
		err = json.Unmarshal(b, &v)
	}
	if err != nil {
		return v, fmt.Errorf("GET /debug/lifecycle: %w", err)
	}
	return v, nil
}

// get fetches path from the daemon's port (with TLS when it serves it)
// and returns the body, within 5 s.
func (d *daemon) get(ctx context.Context, path string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, baseURL(d.addr, d.tlsClient)+path, nil)
	if err != nil {
		return nil, err
	}
	client := http.DefaultClient
	if d.tlsClient != nil {
		tr := &http.Transport{TLSClientConfig: d.tlsClient}
		defer tr.CloseIdleConnections()
		client = &http.Client{Transport: tr}
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return io.ReadAll(resp.Body)
}

// Background tasks of the daemon the benchmark waits for.
const (
	taskFill        = "fill"
	taskReclaimDead = "reclaim-dead"
)

// waitTaskDone polls the lifecycle until the named background task is no
// longer pending or running (up to timeout) and returns the last view. A
// task the daemon never deferred counts as done.
func (d *daemon) waitTaskDone(ctx context.Context, name string, timeout time.Duration) (lifecycleView, error) {
	deadline := time.Now().Add(timeout)
	for {
		v, err := d.lifecycle(ctx)
		if err != nil {
			return v, err
		}
		t, ok := v.task(name)
		if !ok || (t.State != "running" && t.State != "pending") {
			return v, nil
		}
		if time.Now().After(deadline) {
			return v, fmt.Errorf("background task %s still %s after %v", name, t.State, timeout)
		}
		if err := sleep(ctx, 50*time.Millisecond); err != nil {
			return v, err
		}
	}
}

// waitPoolFilled waits until the background pool fill has ended.
func (d *daemon) waitPoolFilled(ctx context.Context, timeout time.Duration) (lifecycleView, error) {
	return d.waitTaskDone(ctx, taskFill, timeout)
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
