package main

import (
	"context"
	"crypto/tls"
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
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/phasegate/phasegate/phases"
)

// buildPhasegate builds ./cmd/phasegate (without -race) into dir.
func buildPhasegate(ctx context.Context, dir string) (string, error) {
	return build(ctx, dir, "phasegate", "github.com/phasegate/phasegate/cmd/phasegate")
}

// buildSerialBaseline builds the serial baseline (./serialbaseline, E2B's
// orchestrator's start on the library's parts) into dir, like the daemon.
func buildSerialBaseline(ctx context.Context, dir string) (string, error) {
	return build(ctx, dir, "serialbaseline", "github.com/phasegate/phasegate/test/bench/serialbaseline")
}

// build builds the main package pkg (without -race) into dir/name.
func build(ctx context.Context, dir, name, pkg string) (string, error) {
	bin := filepath.Join(dir, name)
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, pkg)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %w\n%s", pkg, err, out)
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

// Reclaim modes of a daemon run.
const (
	modeBackground = "background" // the default: dead slots reclaimed after SERVING
	modeForeground = "foreground" // --reclaim=foreground: before the warm slots
	modeSerial     = "serial"     // not phasegate: ./serialbaseline, the E2B orchestrator's start
)

// slotArgs are the flags confining a daemon (or decommission) to h.
func slotArgs(h *host, o options) []string {
	return []string{
		"--state-dir=" + h.stateDir,
		"--netns-dir=" + h.cfg.NetnsDir,
		"--slot-prefix=" + h.cfg.Prefix,
		"--slots=" + strconv.Itoa(h.cfg.Slots),
		"--slot-cidr=" + h.cfg.CIDR.String(),
		"--reclaim-workers=" + strconv.Itoa(o.workers),
	}
}

// daemonArgs returns the serve flags of a daemon confined to h, with a warm
// pool of poolSize.
func daemonArgs(h *host, addr string, o options, mode string, poolSize int) []string {
	args := append([]string{"serve", "--listen=" + addr}, slotArgs(h, o)...)
	args = append(args,
		"--pool-size="+strconv.Itoa(poolSize),
		"--pool-min-ready=1",
		"--drain-delay=20ms",
		"--stop-timeout=5s",
		// A slow start is measured, not cut off at the default 5 min; the
		// report says when a start took longer than that default.
		"--start-timeout=0",
		// The Slots API's calls are measured, not the control surface's
		// per-principal rate limit (default 100 calls/s): the benchmark
		// calls as root, one principal, far faster than that.
		"--control-rate=0",
		"--log-format=json",
	)
	if mode == modeForeground {
		args = append(args, "--reclaim=foreground")
	}
	return args
}

// serialArgs returns the flags of the serial baseline confined to h, with
// the daemon's pool settings and stop bounds (daemonArgs).
func serialArgs(h *host, addr string, poolSize int) []string {
	return []string{
		"--listen=" + addr,
		"--netns-dir=" + h.cfg.NetnsDir,
		"--slot-prefix=" + h.cfg.Prefix,
		"--slots=" + strconv.Itoa(h.cfg.Slots),
		"--slot-cidr=" + h.cfg.CIDR.String(),
		"--pool-size=" + strconv.Itoa(poolSize),
		"--pool-min-ready=1",
		"--drain-delay=20ms",
		"--stop-timeout=5s",
	}
}

// daemon is a running phasegate process (the same process across in-place
// upgrades: an upgrade executes a new image with the same pid and the same
// output pipe).
type daemon struct {
	cmd  *exec.Cmd
	addr string
	// control is the path of its control socket, where the Slots API is
	// served: from --control-socket, else in --state-dir.
	control string
	began   time.Time
	// tlsClient is how the benchmark's own clients (the start's pollers, the
	// lifecycle view) reach a daemon started with --tls-cert: its
	// certificate, self-signed, as their only root; nil for plain text.
	tlsClient *tls.Config
	done      chan struct{} // closed when the process has exited
	err       error         // Wait's result, set before done is closed
	logs      *logTail
}

// heldSocketScript hands the inherited descriptor 3 to the daemon the way
// systemd's socket activation does: LISTEN_PID must be the daemon's own
// pid, known only after the fork, so a shell exports its own pid and then
// executes the daemon in its place.
const heldSocketScript = `export LISTEN_PID=$$; exec "$0" "$@"`

// startDaemon execs bin with args; began is taken right before the exec.
// With held, the daemon gets that listening socket as systemd socket
// activation gives it (LISTEN_FDS=1, descriptor 3) instead of binding its
// port.
func startDaemon(bin string, args []string, held *os.File) (*daemon, error) {
	d := &daemon{done: make(chan struct{}), logs: newLogTail(200)}
	var stateDir string
	if held == nil {
		d.cmd = exec.Command(bin, args...)
	} else {
		d.cmd = exec.Command("/bin/sh", append([]string{"-c", heldSocketScript, bin}, args...)...)
		d.cmd.ExtraFiles = []*os.File{held}
		d.cmd.Env = append(os.Environ(), "LISTEN_FDS=1", "LISTEN_FDNAMES=listen")
	}
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--listen="); ok {
			d.addr = v
		}
		// The last of a repeated flag counts, as in the daemon's.
		if v, ok := strings.CutPrefix(a, "--state-dir="); ok {
			stateDir = v
		}
		if v, ok := strings.CutPrefix(a, "--control-socket="); ok {
			d.control = v
		}
		if v, ok := strings.CutPrefix(a, "--tls-cert="); ok {
			cfg, err := clientTLS(v)
			if err != nil {
				return nil, err
			}
			d.tlsClient = cfg
		}
	}
	if d.control == "" && stateDir != "" {
		d.control = filepath.Join(stateDir, phases.ControlSocketName)
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

// slotsTarget is the gRPC target of its Slots API: its control socket.
func (d *daemon) slotsTarget() string {
	return "unix://" + d.control
}

// stop sends SIGTERM (the daemon drains and keeps its slots, recorded) and
// waits up to 30 s before killing it. It returns how long the process took
// to exit, and an error when it did not exit cleanly.
func (d *daemon) stop() (time.Duration, error) {
	select {
	case <-d.done:
		return 0, d.exitErr("exited before it was stopped")
	default:
	}
	t0 := time.Now()
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(30 * time.Second)
	defer t.Stop()
	select {
	case <-d.done:
		return time.Since(t0), d.exitErr("drain")
	case <-t.C:
		_ = d.cmd.Process.Kill()
		<-d.done
		return time.Since(t0), fmt.Errorf("phasegate did not stop within 30 s of SIGTERM; killed\n%s", d.logs)
	}
}

// kill ends the process at once (SIGKILL) and waits for it. Harmless on a
// process that has exited.
func (d *daemon) kill() {
	_ = d.cmd.Process.Kill()
	<-d.done
}

// exited reports whether the process has exited.
func (d *daemon) exited() bool {
	select {
	case <-d.done:
		return true
	default:
		return false
	}
}

// signal sends sig to the daemon.
func (d *daemon) signal(sig os.Signal) error {
	if err := d.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("signal %v to phasegate: %w", sig, err)
	}
	return nil
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

// Log messages of the daemon the benchmark follows.
const (
	msgStarting      = "phasegate starting"
	msgServing       = "serving"
	msgReclaimReport = "reclaim report"
	msgPaced         = "background reclaim paced"
	msgRestorePrefix = "restore: "
	msgRestore       = "restore" // the key under which restore lines are kept
	msgVerified      = "restored leases verified"
	msgInside        = "restored leases: inside of their slots verified"
	msgUpgrading     = "SIGHUP: upgrading in place"
)

// reclaimReport is the daemon's "reclaim report" log line.
type reclaimReport struct {
	Found     int           `json:"found"`
	Reclaimed int           `json:"reclaimed"`
	Failed    int           `json:"failed"`
	CutOff    int           `json:"cut_off"`
	RawDur    string        `json:"duration"`
	Duration  time.Duration `json:"-"`
	// At is when the line reached the benchmark; Line is the line.
	At   time.Time `json:"-"`
	Line string    `json:"-"`
}

// reclaimReport returns the daemon's k-th reclaim report (0-based) in its
// JSON log, waiting for it up to timeout.
func (d *daemon) reclaimReport(ctx context.Context, k int, timeout time.Duration) (reclaimReport, error) {
	var r reclaimReport
	ev, err := d.logLine(ctx, msgReclaimReport, k, timeout, &r)
	if err != nil {
		return r, err
	}
	if r.Duration, err = time.ParseDuration(r.RawDur); err != nil {
		return r, fmt.Errorf("reclaim report duration %q: %w", r.RawDur, err)
	}
	r.At, r.Line = ev.at, ev.line
	return r, nil
}

// pacedLine returns the daemon's first "background reclaim paced" line as
// it is (what the pacer did), or "" if there is none: it is logged just
// before the reclaim report, so call it once that has arrived.
func (d *daemon) pacedLine() string {
	d.logs.mu.Lock()
	defer d.logs.mu.Unlock()
	if evs := d.logs.events[msgPaced]; len(evs) > 0 {
		return evs[0].line
	}
	return ""
}

// restoreLine is the daemon's "restore: …" log line: what the start found.
type restoreLine struct {
	Restored int `json:"restored"`
	Adopted  int `json:"adopted"`
	Reclaim  int `json:"reclaim"`
	Lost     int `json:"lost"`
}

// verifiedLine is the daemon's "restored leases verified" log line, which
// ends the verification of the restored leases after SERVING.
type verifiedLine struct {
	Leases     int `json:"leases"`
	Intact     int `json:"intact"`
	Lost       int `json:"lost"`
	Unverified int `json:"unverified"`
	at         time.Time
}

// verifiedLine waits for the daemon's k-th verified line (0-based; one per
// start that restored leases).
func (d *daemon) verifiedLine(ctx context.Context, k int, timeout time.Duration) (verifiedLine, error) {
	var v verifiedLine
	ev, err := d.logLine(ctx, msgVerified, k, timeout, &v)
	v.at = ev.at
	return v, err
}

// logLine waits up to timeout for the daemon's k-th line (0-based) kept
// under key, decodes it into v and returns it as it arrived.
func (d *daemon) logLine(ctx context.Context, key string, k int, timeout time.Duration, v any) (logEvent, error) {
	ev, err := d.logs.wait(ctx, key, k, timeout, d.done)
	if err != nil {
		return ev, fmt.Errorf("%q line: %w\n%s", key, err, d.logs)
	}
	if err := json.Unmarshal([]byte(ev.line), v); err != nil {
		return ev, fmt.Errorf("%q line %q: %w", key, ev.line, err)
	}
	return ev, nil
}

// insideLine is the daemon's line that ends verify-inside, the background
// check of what the restored leases' namespaces hold (guest device,
// egress policy), after the leases' own verification.
type insideLine struct {
	Verified int `json:"verified"`
	Repaired int `json:"repaired"`
	at       time.Time
}

// insideLine waits for the daemon's k-th inside line (0-based; one per
// start that restored leases with something inside to verify).
func (d *daemon) insideLine(ctx context.Context, k int, timeout time.Duration) (insideLine, error) {
	var v insideLine
	ev, err := d.logLine(ctx, msgInside, k, timeout, &v)
	v.at = ev.at
	return v, err
}

// restoreLine returns the daemon's k-th restore line (0-based; one per
// start, upgrades included).
func (d *daemon) restoreLine(ctx context.Context, k int) (restoreLine, error) {
	var r restoreLine
	_, err := d.logLine(ctx, msgRestore, k, 10*time.Second, &r)
	return r, err
}

// logEvent is a log line the benchmark follows, with when it arrived.
type logEvent struct {
	at   time.Time
	line string
}

// logTail keeps the last n lines of a process's output and, with their
// arrival times, every line whose message the benchmark follows.
type logTail struct {
	mu      sync.Mutex
	partial []byte
	events  map[string][]logEvent
	changed chan struct{} // closed and replaced at every event
	last    []string
	n       int
}

func newLogTail(n int) *logTail {
	return &logTail{n: n, events: map[string][]logEvent{}, changed: make(chan struct{})}
}

// followed returns the key under which a line with message msg is kept, or
// "".
func followed(msg string) string {
	switch {
	case strings.HasPrefix(msg, msgRestorePrefix):
		return msgRestore
	case msg == msgStarting, msg == msgServing, msg == msgReclaimReport, msg == msgPaced, msg == msgUpgrading, msg == msgPoolReady, msg == msgVerified, msg == msgInside:
		return msg
	}
	return ""
}

// Write implements io.Writer.
func (l *logTail) Write(p []byte) (int, error) {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.partial = append(l.partial, p...)
	complete := strings.LastIndexByte(string(l.partial), '\n')
	if complete < 0 {
		return len(p), nil
	}
	notify := false
	for _, line := range strings.Split(string(l.partial[:complete]), "\n") {
		var m struct {
			Msg string `json:"msg"`
		}
		if strings.HasPrefix(line, "{") && json.Unmarshal([]byte(line), &m) == nil {
			if key := followed(m.Msg); key != "" {
				l.events[key] = append(l.events[key], logEvent{at: now, line: line})
				notify = true
			}
		}
		l.last = append(l.last, line)
		if len(l.last) > l.n {
			l.last = l.last[len(l.last)-l.n:]
		}
	}
	l.partial = append(l.partial[:0], l.partial[complete+1:]...)
	if notify {
		close(l.changed)
		l.changed = make(chan struct{})
	}
	return len(p), nil
}

// count returns how many lines with key arrived so far.
func (l *logTail) count(key string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.events[key])
}

// wait returns the k-th (0-based) line kept under key, waiting up to
// timeout for it, or until exited is closed.
func (l *logTail) wait(ctx context.Context, key string, k int, timeout time.Duration, exited <-chan struct{}) (logEvent, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		l.mu.Lock()
		evs, changed := l.events[key], l.changed
		l.mu.Unlock()
		if len(evs) > k {
			return evs[k], nil
		}
		select {
		case <-changed:
		case <-exited:
			// The last lines may still be on their way through the pipe.
			exited = nil
			t.Reset(100 * time.Millisecond)
		case <-t.C:
			return logEvent{}, fmt.Errorf("no %q line #%d after %v", key, k+1, timeout)
		case <-ctx.Done():
			return logEvent{}, ctx.Err()
		}
	}
}

// lastLine returns the last line the daemon wrote: after a failed start,
// the cause.
func (d *daemon) lastLine() string {
	d.logs.mu.Lock()
	defer d.logs.mu.Unlock()
	if len(d.logs.last) == 0 {
		return d.exitErr("exited").Error()
	}
	return d.logs.last[len(d.logs.last)-1]
}

// String returns the last lines, for error messages.
func (l *logTail) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.last, "\n")
}
