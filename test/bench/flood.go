package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/phasegate/phasegate/test/internal/portflood"
)

// floodUser is who floods the port: another user than the daemon's and
// the owner's (root).
const floodUser = "nobody"

// FloodResult is health and the owner's Acquire latency while another user
// floods the port with connections, beside windows of the same length on
// the same daemon while nothing floods (quiet) and while the same flood is
// aimed at a bare socket elsewhere on the machine (elsewhere: what the
// flood costs the machine, whatever it floods), pooled over the reps; Runs
// has each rep's.
type FloodResult struct {
	Reps        int     `json:"reps"`
	WindowMs    float64 `json:"windowMs"`
	ProbeRate   int     `json:"probesPerS"`
	AcquireRate int     `json:"acquirePerS"`
	// Conns is what the flood tops up to each second.
	Conns     int                     `json:"floodConns"`
	Quiet     map[string]LatencyStats `json:"quiet"`
	Flood     map[string]LatencyStats `json:"flood"`
	Elsewhere map[string]LatencyStats `json:"floodElsewhere"`
	Runs      []FloodRun              `json:"runs"`
}

// Windows of a flood rep.
const (
	winQuiet     = "quiet"
	winFlood     = "flooded"
	winElsewhere = "flood elsewhere"
)

var floodWindows = []string{winQuiet, winFlood, winElsewhere}

// FloodRun is one rep: its two windows, what the flooding client saw, and
// the daemon's peak descriptors and memory during the flood.
type FloodRun struct {
	// Order is the windows' order in this rep.
	Order     []string                `json:"order"`
	Quiet     map[string]LatencyStats `json:"quiet"`
	Flood     map[string]LatencyStats `json:"flood"`
	Elsewhere map[string]LatencyStats `json:"floodElsewhere"`
	// Report is what the flood of the daemon's port saw, and Sink what
	// the flood elsewhere saw.
	Report    portflood.Report `json:"floodReport"`
	Sink      portflood.Report `json:"sinkReport"`
	MaxFDs    int              `json:"maxFDs"`
	MaxRSSMiB float64          `json:"maxRssMiB"`
	// The share of one CPU each used in a window (user + system time over
	// the window's length): the daemon in each window, and the flooding
	// client against the daemon.
	DaemonCPUQuiet     float64 `json:"daemonCpuQuiet"`
	DaemonCPUFlood     float64 `json:"daemonCpuFlood"`
	DaemonCPUElsewhere float64 `json:"daemonCpuElsewhere"`
	FloodCPU           float64 `json:"floodCpu"`
}

// measureFlood measures, -reps times, a daemon probed from its start by
// two load generators — checks on a new connection each (-probe-rate, half
// HTTP /health, half gRPC Check) and the owner's Acquire on the control
// socket (-acquire-rate) — through two windows of -flood-duration: quiet,
// and while nobody floods the port (as many gRPC connections as it can
// get, topped up to -flood-conns each second, a Check on each, held); the
// order of the windows alternates from rep to rep.
func (r *runner) measureFlood(ctx context.Context) error {
	bin, cleanup, err := publicCopy()
	if err != nil {
		return err
	}
	defer cleanup()
	res := &FloodResult{Reps: r.o.reps, WindowMs: ms(r.o.floodDuration), ProbeRate: r.o.probeRate,
		AcquireRate: r.o.acquireRate, Conns: r.o.floodConns}
	sink, err := r.startSink(bin)
	if err != nil {
		return err
	}
	defer sink.kill()
	byWindow := map[string][]sample{}
	for rep := range r.o.reps {
		r.sampleLoad()
		order := append(append([]string{}, floodWindows[rep%3:]...), floodWindows[:rep%3]...)
		run, samples, err := r.floodRun(ctx, bin, sink.addr, order)
		if err != nil {
			return err
		}
		for w, s := range samples {
			byWindow[w] = append(byWindow[w], s...)
		}
		res.Runs = append(res.Runs, run)
		r.logf("flood rep %d (%s): gRPC p99 %s quiet, %s flooded, %s flood elsewhere; Acquire p99 %s, %s, %s; nobody held %d, %d of %d refused; "+
			"daemon at most %d descriptors, %.0f MiB, CPU %.0f%% quiet, %.0f%% flooded, %.0f%% flood elsewhere; the flood's CPU %.0f%%",
			rep+1, strings.Join(order, ", "), fmtMs(run.Quiet[kindGRPC].P99Ms), fmtMs(run.Flood[kindGRPC].P99Ms), fmtMs(run.Elsewhere[kindGRPC].P99Ms),
			fmtMs(run.Quiet[kindAcquire].P99Ms), fmtMs(run.Flood[kindAcquire].P99Ms), fmtMs(run.Elsewhere[kindAcquire].P99Ms),
			run.Report.Held, run.Report.Refused, run.Report.Attempts, run.MaxFDs, run.MaxRSSMiB,
			100*run.DaemonCPUQuiet, 100*run.DaemonCPUFlood, 100*run.DaemonCPUElsewhere, 100*run.FloodCPU)
	}
	res.Quiet, res.Flood, res.Elsewhere = latencyByKind(byWindow[winQuiet]), latencyByKind(byWindow[winFlood]), latencyByKind(byWindow[winElsewhere])
	r.res.Flood = res
	return nil
}

// floodRun is one rep: a daemon, its load generators, and the three
// windows in order; then the daemon is stopped and its slots removed. It
// returns the load generators' samples by window.
func (r *runner) floodRun(ctx context.Context, bin, sinkAddr string, order []string) (run FloodRun, byWindow map[string][]sample, err error) {
	run.Order = order
	addr, err := freeAddr()
	if err != nil {
		return run, nil, err
	}
	d, _, failures, err := r.startServing(ctx, daemonArgs(r.h, addr, r.o, modeBackground, r.o.poolSize), nil, startTimeout(0, modeBackground))
	if err != nil {
		return run, nil, err
	}
	if len(failures) > 0 {
		d.kill()
		return run, nil, fmt.Errorf("the daemon failed its start %d times (%s)", len(failures), failures[0])
	}
	defer func() {
		if err != nil {
			d.kill()
		}
	}()
	if _, err = d.waitPoolFilled(ctx, 2*time.Minute); err != nil {
		return run, nil, err
	}
	var g loadgens
	if g.daemon, err = r.startLoadgen(addr, genProbe, r.o.probeRate, loadgenMaxDuration); err != nil {
		return run, nil, err
	}
	if g.acquire, err = r.startLoadgen(addr, genAcquire, r.o.acquireRate, loadgenMaxDuration); err != nil {
		return run, nil, err
	}
	// The generators connect first; the windows start after.
	if err = sleep(ctx, time.Second); err != nil {
		return run, nil, err
	}
	spans := map[string][2]int64{}
	pid := d.cmd.Process.Pid
	for _, w := range order {
		from, cpu0 := time.Now(), procCPU(pid)
		switch w {
		case winQuiet:
			err = sleep(ctx, r.o.floodDuration)
		case winFlood:
			err = r.floodWindow(ctx, bin, addr, pid, &run.Report, &run)
		case winElsewhere:
			err = r.floodWindow(ctx, bin, sinkAddr, 0, &run.Sink, nil)
		}
		if err != nil {
			return run, nil, err
		}
		cpu := (procCPU(pid) - cpu0).Seconds() / time.Since(from).Seconds()
		*map[string]*float64{winQuiet: &run.DaemonCPUQuiet, winFlood: &run.DaemonCPUFlood, winElsewhere: &run.DaemonCPUElsewhere}[w] = cpu
		spans[w] = [2]int64{from.UnixNano(), time.Now().UnixNano()}
		// The flood's connections close after it; the next window waits.
		if err = sleep(ctx, time.Second); err != nil {
			return run, nil, err
		}
	}
	all, err := g.daemon.finish(true, 30*time.Second)
	if err != nil {
		return run, nil, err
	}
	acquires, err := g.acquire.finish(true, 30*time.Second)
	if err != nil {
		return run, nil, err
	}
	all = append(all, acquires...)
	byWindow = map[string][]sample{}
	for w, sp := range spans {
		byWindow[w] = inWindow(all, sp[0], sp[1])
	}
	run.Quiet, run.Flood, run.Elsewhere = latencyByKind(byWindow[winQuiet]), latencyByKind(byWindow[winFlood]), latencyByKind(byWindow[winElsewhere])
	if _, err = d.stop(); err != nil {
		return run, nil, err
	}
	return run, byWindow, r.reset(ctx)
}

// floodWindow runs the flood as floodUser against addr for
// -flood-duration and fills rep with its report; with run, also its CPU
// and the daemon's (pid) peak descriptors and VmRSS meanwhile.
func (r *runner) floodWindow(ctx context.Context, bin, addr string, pid int, rep *portflood.Report, run *FloodRun) error {
	t0 := time.Now()
	spec := fmt.Sprintf("grpc|%s|%d|%d", addr, r.o.floodConns, int(r.o.floodDuration.Seconds()))
	cmd := exec.CommandContext(ctx, "runuser", "-u", floodUser, "--", bin, "flood", spec)
	var stderr bytes.Buffer
	cmd.Stderr, cmd.Dir = &stderr, filepath.Dir(bin)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("flood as %s: %w", floodUser, err)
	}
	r.track(func() { _ = cmd.Process.Kill() })
	done := make(chan struct{})
	var wg sync.WaitGroup
	var maxFDs int
	var maxRSS float64
	wg.Go(func() {
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for run != nil {
			fds, rss := procUsage(pid)
			maxFDs, maxRSS = max(maxFDs, fds), max(maxRSS, rss)
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	})
	lines, err := io.ReadAll(out)
	close(done)
	wg.Wait()
	if werr := cmd.Wait(); err == nil && werr != nil {
		err = fmt.Errorf("flood as %s: %w: %s", floodUser, werr, strings.TrimSpace(stderr.String()))
	}
	if err != nil {
		return err
	}
	sc := bufio.NewScanner(bytes.NewReader(lines))
	var last string
	for sc.Scan() {
		last = sc.Text()
	}
	if err := json.Unmarshal([]byte(last), rep); err != nil {
		return fmt.Errorf("flood as %s: its report %q: %w", floodUser, last, err)
	}
	if run != nil {
		// runuser waited for the client: its usage holds the client's.
		used := cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
		run.FloodCPU = used.Seconds() / time.Since(t0).Seconds()
		run.MaxFDs, run.MaxRSSMiB = maxFDs, maxRSS
	}
	return nil
}

// procCPU is a process's user and system time so far (/proc/PID/stat).
func procCPU(pid int) time.Duration {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// The fields after the command (which may hold spaces) start after
	// its closing parenthesis; utime and stime are the 14th and 15th.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / clockTicks
}

// clockTicks is the kernel's USER_HZ, the unit of /proc's times.
const clockTicks = 100

// procUsage reads a process's open descriptors and VmRSS (MiB).
func procUsage(pid int) (fds int, rssMiB float64) {
	p := "/proc/" + strconv.Itoa(pid)
	if es, err := os.ReadDir(p + "/fd"); err == nil {
		fds = len(es)
	}
	b, _ := os.ReadFile(p + "/status")
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			rssMiB = float64(kb) / 1024
		}
	}
	return fds, rssMiB
}

// publicCopy copies this program where floodUser may run it.
func publicCopy() (bin string, cleanup func(), err error) {
	self, err := os.Executable()
	if err != nil {
		return "", nil, err
	}
	dir, err := os.MkdirTemp("", "phasegate-bench-flood-")
	if err != nil {
		return "", nil, err
	}
	cleanup = func() { os.RemoveAll(dir) }
	bin = filepath.Join(dir, "bench")
	if err := errors.Join(os.Chmod(dir, 0o755), copyExecutable(self, bin)); err != nil {
		cleanup()
		return "", nil, fmt.Errorf("a copy of the benchmark %s may run: %w", floodUser, err)
	}
	return bin, cleanup, nil
}

// copyExecutable copies from to a new file to, mode 0755.
func copyExecutable(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// sinkMain is the `sink` subcommand: a bare socket on -addr that refuses
// every connection the way the daemon's port refuses one over its bounds
// (accepted, then closed with a reset), for the flood part's "flood
// elsewhere" window: what the same flood costs the machine when it is not
// aimed at the daemon. It serves until SIGINT/SIGTERM.
func sinkMain(args []string, stderr io.Writer) int {
	if len(args) != 2 || args[0] != "-addr" {
		fmt.Fprintln(stderr, "sink: need -addr 127.0.0.1:port")
		return exitUsage
	}
	l, err := net.Listen("tcp", args[1])
	if err != nil {
		fmt.Fprintln(stderr, "sink:", err)
		return exitError
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	context.AfterFunc(ctx, func() { l.Close() })
	for {
		c, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return exitOK
			}
			continue
		}
		_ = c.(*net.TCPConn).SetLinger(0)
		c.Close()
	}
}

// sinkServer is the running `bench sink`.
type sinkServer struct {
	d    *daemon
	addr string
}

func (s sinkServer) kill() { s.d.kill() }

// startSink starts `bench sink` (bin is this program) on a free loopback
// port.
func (r *runner) startSink(bin string) (sinkServer, error) {
	var s sinkServer
	var err error
	if s.addr, err = freeAddr(); err != nil {
		return s, err
	}
	if s.d, err = startDaemon(bin, []string{"sink", "-addr", s.addr}, nil); err != nil {
		return s, err
	}
	r.track(s.d.kill)
	return s, nil
}
