package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/phasegate/phasegate/test/internal/portflood"
)

// floodUser is who floods the port: another user than the daemon's and
// the owner's (root).
const floodUser = "nobody"

// FloodResult is health and the owner's Acquire latency while another user
// floods the port with connections, beside a quiet run of the same length
// on the same daemon, pooled over the reps; Runs has each rep's.
type FloodResult struct {
	Reps        int     `json:"reps"`
	WindowMs    float64 `json:"windowMs"`
	ProbeRate   int     `json:"probesPerS"`
	AcquireRate int     `json:"acquirePerS"`
	// Conns is what the flood tops up to each second.
	Conns int                     `json:"floodConns"`
	Quiet map[string]LatencyStats `json:"quiet"`
	Flood map[string]LatencyStats `json:"flood"`
	Runs  []FloodRun              `json:"runs"`
}

// FloodRun is one rep: its two windows, what the flooding client saw, and
// the daemon's peak descriptors and memory during the flood.
type FloodRun struct {
	FloodFirst bool                    `json:"floodFirst"`
	Quiet      map[string]LatencyStats `json:"quiet"`
	Flood      map[string]LatencyStats `json:"flood"`
	Report     portflood.Report        `json:"floodReport"`
	MaxFDs     int                     `json:"maxFDs"`
	MaxRSSMiB  float64                 `json:"maxRssMiB"`
	// CPU is the share of one CPU each used in a window (user + system
	// time over the window's length): the daemon quiet and flooded, and
	// the flooding client.
	DaemonCPUQuiet float64 `json:"daemonCpuQuiet"`
	DaemonCPUFlood float64 `json:"daemonCpuFlood"`
	FloodCPU       float64 `json:"floodCpu"`
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
	var quiet, flood []sample
	for rep := range r.o.reps {
		r.sampleLoad()
		run, q, f, err := r.floodRun(ctx, bin, rep%2 == 1)
		if err != nil {
			return err
		}
		quiet, flood = append(quiet, q...), append(flood, f...)
		res.Runs = append(res.Runs, run)
		r.logf("flood rep %d: gRPC p99 %s quiet, %s flooded; Acquire p99 %s quiet, %s flooded; nobody held %d, %d of %d refused; "+
			"daemon at most %d descriptors, %.0f MiB, CPU %.0f%% quiet, %.0f%% flooded; the flood's CPU %.0f%%",
			rep+1, fmtMs(run.Quiet[kindGRPC].P99Ms), fmtMs(run.Flood[kindGRPC].P99Ms), fmtMs(run.Quiet[kindAcquire].P99Ms),
			fmtMs(run.Flood[kindAcquire].P99Ms), run.Report.Held, run.Report.Refused, run.Report.Attempts, run.MaxFDs, run.MaxRSSMiB,
			100*run.DaemonCPUQuiet, 100*run.DaemonCPUFlood, 100*run.FloodCPU)
	}
	res.Quiet, res.Flood = latencyByKind(quiet), latencyByKind(flood)
	r.res.Flood = res
	return nil
}

// floodRun is one rep: a daemon, its load generators, a quiet window and
// a flooded one; then the daemon is stopped and its slots removed.
func (r *runner) floodRun(ctx context.Context, bin string, floodFirst bool) (run FloodRun, quiet, flood []sample, err error) {
	run.FloodFirst = floodFirst
	addr, err := freeAddr()
	if err != nil {
		return run, nil, nil, err
	}
	d, _, failures, err := r.startServing(ctx, daemonArgs(r.h, addr, r.o, modeBackground, r.o.poolSize), nil, startTimeout(0, modeBackground))
	if err != nil {
		return run, nil, nil, err
	}
	if len(failures) > 0 {
		d.kill()
		return run, nil, nil, fmt.Errorf("the daemon failed its start %d times (%s)", len(failures), failures[0])
	}
	defer func() {
		if err != nil {
			d.kill()
		}
	}()
	if _, err = d.waitPoolFilled(ctx, 2*time.Minute); err != nil {
		return run, nil, nil, err
	}
	var g loadgens
	if g.daemon, err = r.startLoadgen(addr, genProbe, r.o.probeRate, loadgenMaxDuration); err != nil {
		return run, nil, nil, err
	}
	if g.acquire, err = r.startLoadgen(addr, genAcquire, r.o.acquireRate, loadgenMaxDuration); err != nil {
		return run, nil, nil, err
	}
	// The generators connect first; the windows start after.
	if err = sleep(ctx, time.Second); err != nil {
		return run, nil, nil, err
	}
	var qw, fw [2]int64
	pid := d.cmd.Process.Pid
	for _, flooded := range []bool{floodFirst, !floodFirst} {
		from, cpu0 := time.Now().UnixNano(), procCPU(pid)
		if flooded {
			err = r.floodWindow(ctx, bin, addr, pid, &run)
			fw = [2]int64{from, time.Now().UnixNano()}
			run.DaemonCPUFlood = (procCPU(pid) - cpu0).Seconds() / time.Duration(fw[1]-fw[0]).Seconds()
		} else {
			err = sleep(ctx, r.o.floodDuration)
			qw = [2]int64{from, time.Now().UnixNano()}
			run.DaemonCPUQuiet = (procCPU(pid) - cpu0).Seconds() / time.Duration(qw[1]-qw[0]).Seconds()
		}
		if err != nil {
			return run, nil, nil, err
		}
		// The flood's connections close after it; the next window waits.
		if err = sleep(ctx, time.Second); err != nil {
			return run, nil, nil, err
		}
	}
	all, err := g.daemon.finish(true, 30*time.Second)
	if err != nil {
		return run, nil, nil, err
	}
	acquires, err := g.acquire.finish(true, 30*time.Second)
	if err != nil {
		return run, nil, nil, err
	}
	all = append(all, acquires...)
	quiet, flood = inWindow(all, qw[0], qw[1]), inWindow(all, fw[0], fw[1])
	run.Quiet, run.Flood = latencyByKind(quiet), latencyByKind(flood)
	if _, err = d.stop(); err != nil {
		return run, nil, nil, err
	}
	return run, quiet, flood, r.reset(ctx)
}

// floodWindow runs the flood as floodUser for -flood-duration and fills
// run with its report, its CPU and the daemon's peak descriptors and VmRSS
// meanwhile.
func (r *runner) floodWindow(ctx context.Context, bin, addr string, pid int, run *FloodRun) error {
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
		for {
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
	if err := json.Unmarshal([]byte(last), &run.Report); err != nil {
		return fmt.Errorf("flood as %s: its report %q: %w", floodUser, last, err)
	}
	// runuser waited for the client: its usage holds the client's.
	used := cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	run.FloodCPU = used.Seconds() / time.Since(t0).Seconds()
	run.MaxFDs, run.MaxRSSMiB = maxFDs, maxRSS
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
