package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// loadgenMaxDuration bounds a load generator started before a daemon; it is
// interrupted as soon as what it measures is over.
const loadgenMaxDuration = 5 * time.Minute

// seriesBucket is the width of a LoadRun's Series buckets.
const seriesBucket = 250 * time.Millisecond

// checkerHTTPRate and checkerGRPCRate are the rates real checkers use: a
// new HTTP connection each, and Checks on a kept gRPC connection.
const (
	checkerHTTPRate = 20
	checkerGRPCRate = 50
)

// loadProfile is how the health checks are sent.
type loadProfile struct {
	// checker: as real checkers send them (genChecker: HTTP on a new
	// connection each, at httpRate, gRPC on a kept one, at grpcRate);
	// otherwise as a heavy client does (genHealth: keep-alive HTTP and a
	// kept gRPC connection, alternately, at rate).
	checker            bool
	httpRate, grpcRate int
	rate               int
	// acquire: the Acquire generator runs too.
	acquire bool
}

// args are the load generator's mode and rate flags for p.
func (p loadProfile) args() (mode string, rate int, extra []string) {
	if p.checker {
		return genChecker, 1, []string{"-http-rate", strconv.Itoa(p.httpRate), "-grpc-rate", strconv.Itoa(p.grpcRate)}
	}
	return genHealth, p.rate, nil
}

// measureLoad measures health-check and Acquire latency from separate
// load-generator processes, beside a control server probed the same way
// at the same time. Each rep starts a daemon on -load-n dead slots with
// the generators already running and keeps what they sent from SERVING to
// the end of the background reclaim, at the heavy rate (-rate, on kept
// connections: 2,000 new connections/s to the daemon and as many to the
// control server saturate two cores by themselves) with Acquires; then it starts a daemon with nothing to reclaim the same way
// and keeps the same length of time from SERVING (the start's own cost,
// the baseline that isolates the reclaim), and, once that daemon has
// served a while, -idle-duration of idle; then a third start on -load-n
// dead slots at checker rates.
func (r *runner) measureLoad(ctx context.Context) error {
	ctl, err := r.startControl()
	if err != nil {
		return err
	}
	defer ctl.kill()
	heavy := loadProfile{rate: r.o.rate, acquire: r.o.acquireRate > 0}
	checker := loadProfile{checker: true, httpRate: checkerHTTPRate, grpcRate: checkerGRPCRate}
	lr := &LoadResult{N: r.o.loadN, Rate: r.o.rate, AcquireRate: r.o.acquireRate, Reps: r.o.loadReps,
		Checker: &CheckerLoad{HTTPRate: checker.httpRate, GRPCRate: checker.grpcRate}}
	var reclaiming, control, started, idle, chkReclaiming, chkControl []sample
	for rep := range r.o.loadReps {
		r.sampleLoad()
		var run LoadRun
		s, c, window, err := r.loadDuringReclaim(ctx, &run, ctl, heavy)
		if err != nil {
			return err
		}
		reclaiming, control = append(reclaiming, s...), append(control, c...)
		lr.WindowMs = append(lr.WindowMs, ms(window))
		r.logf("load rep %d: %d requests during a %s background reclaim of %d (gRPC p99 %s, control %s; Acquire p99 %s)", rep+1, len(s),
			fmtMs(ms(window)), r.o.loadN, fmtMs(run.Reclaim[kindGRPC].P99Ms), fmtMs(run.Control[kindGRPC].P99Ms), fmtMs(run.Reclaim[kindAcquire].P99Ms))
		r.logf("load rep %d: the reclaim's lines:\n\t%s", rep+1, strings.Join(run.ReclaimLog, "\n\t"))
		st, id, err := r.loadAfterStart(ctx, window, ctl, heavy)
		if err != nil {
			return err
		}
		run.Start, run.Idle = latencyByKind(st), latencyByKind(id)
		started, idle = append(started, st...), append(idle, id...)
		r.logf("load rep %d: %d requests after a start with nothing to reclaim (gRPC p99 %s), %d idle (gRPC p99 %s)", rep+1,
			len(st), fmtMs(run.Start[kindGRPC].P99Ms), len(id), fmtMs(run.Idle[kindGRPC].P99Ms))
		lr.Runs = append(lr.Runs, run)

		var crun LoadRun
		s, c, window, err = r.loadDuringReclaim(ctx, &crun, ctl, checker)
		if err != nil {
			return err
		}
		chkReclaiming, chkControl = append(chkReclaiming, s...), append(chkControl, c...)
		lr.Checker.WindowMs = append(lr.Checker.WindowMs, ms(window))
		r.logf("load rep %d: %d checks at checker rates during a %s background reclaim of %d (gRPC p99 %s, control %s; HTTP p99 %s, control %s)",
			rep+1, len(s), fmtMs(ms(window)), r.o.loadN, fmtMs(crun.Reclaim[kindGRPC].P99Ms), fmtMs(crun.Control[kindGRPC].P99Ms),
			fmtMs(crun.Reclaim[kindHTTP].P99Ms), fmtMs(crun.Control[kindHTTP].P99Ms))
		r.logf("load rep %d: the reclaim's lines at checker rates:\n\t%s", rep+1, strings.Join(crun.ReclaimLog, "\n\t"))
	}
	lr.Reclaim, lr.Control, lr.Start, lr.Idle = latencyByKind(reclaiming), latencyByKind(control), latencyByKind(started), latencyByKind(idle)
	lr.Checker.Reclaim, lr.Checker.Control = latencyByKind(chkReclaiming), latencyByKind(chkControl)
	r.res.Load = lr
	return nil
}

// controlServer is the running `bench control` process.
type controlServer struct {
	d              *daemon
	http, grpcAddr string
}

func (c controlServer) kill() { c.d.kill() }

// startControl re-execs this binary as `control` on two free loopback
// ports.
func (r *runner) startControl() (controlServer, error) {
	var c controlServer
	self, err := os.Executable()
	if err != nil {
		return c, fmt.Errorf("control: %w", err)
	}
	if c.http, err = freeAddr(); err != nil {
		return c, err
	}
	if c.grpcAddr, err = freeAddr(); err != nil {
		return c, err
	}
	if c.d, err = startDaemon(self, []string{"control", "-http", c.http, "-grpc", c.grpcAddr}, nil); err != nil {
		return c, err
	}
	r.track(c.d.kill)
	return c, nil
}

// loadgens are the load part's generators: health checks on the daemon,
// the same on the control server, and, at a modest rate, Acquire calls.
type loadgens struct{ daemon, control, acquire *loadgen }

func (r *runner) startLoadgens(addr string, ctl controlServer, p loadProfile, duration time.Duration) (loadgens, error) {
	var g loadgens
	var err error
	mode, rate, extra := p.args()
	if g.daemon, err = r.startLoadgen(addr, mode, rate, duration, extra...); err != nil {
		return g, err
	}
	if g.control, err = r.startLoadgen(ctl.http, mode, rate, duration, append(extra, "-grpc-addr", ctl.grpcAddr)...); err != nil {
		return g, err
	}
	if p.acquire {
		if g.acquire, err = r.startLoadgen(addr, genAcquire, r.o.acquireRate, duration); err != nil {
			return g, err
		}
	}
	return g, nil
}

// finish ends the generators (interrupt: now) and returns the daemon's
// samples (health and Acquire) and the control server's.
func (g loadgens) finish(interrupt bool, timeout time.Duration) (daemon, control []sample, err error) {
	if daemon, err = g.daemon.finish(interrupt, timeout); err != nil {
		return nil, nil, err
	}
	if control, err = g.control.finish(interrupt, timeout); err != nil {
		return nil, nil, err
	}
	if g.acquire != nil {
		a, err := g.acquire.finish(interrupt, timeout)
		if err != nil {
			return nil, nil, err
		}
		daemon = append(daemon, a...)
	}
	return daemon, control, nil
}

// loadDuringReclaim starts the load generators, then the daemon on -load-n
// dead slots; it keeps the requests sent from SERVING (or the start of the
// reclaim task, if later) to the end of the reclaim task, the daemon's and
// the control server's, and fills run.
func (r *runner) loadDuringReclaim(ctx context.Context, run *LoadRun, ctl controlServer, p loadProfile) (kept, control []sample, window time.Duration, err error) {
	if err := r.leak(ctx, r.o.loadN); err != nil {
		return nil, nil, 0, err
	}
	addr, err := freeAddr()
	if err != nil {
		return nil, nil, 0, err
	}
	g, err := r.startLoadgens(addr, ctl, p, loadgenMaxDuration)
	if err != nil {
		return nil, nil, 0, err
	}
	d, su, failures, err := r.startServing(ctx, daemonArgs(r.h, addr, r.o, modeBackground, r.o.poolSize), nil, startTimeout(r.o.loadN, modeBackground))
	if err != nil {
		return nil, nil, 0, err
	}
	if len(failures) > 0 {
		return nil, nil, 0, fmt.Errorf("the daemon failed its start %d times (%s): the load measured would not be the reclaim's", len(failures), failures[0])
	}
	kept, control, window, err = r.collectDuringReclaim(ctx, d, su, g, run)
	if err != nil {
		d.kill()
		return nil, nil, 0, err
	}
	if _, err := d.stop(); err != nil {
		return nil, nil, 0, err
	}
	return kept, control, window, r.reset(ctx)
}

func (r *runner) collectDuringReclaim(ctx context.Context, d *daemon, su startup, g loadgens, run *LoadRun) (kept, control []sample, window time.Duration, err error) {
	rep, err := d.reclaimReport(ctx, 0, startTimeout(r.o.loadN, modeBackground))
	if err != nil {
		return nil, nil, 0, err
	}
	if rep.Reclaimed != r.o.loadN {
		return nil, nil, 0, fmt.Errorf("reclaim report: reclaimed %d of %d\n%s", rep.Reclaimed, r.o.loadN, d.logs)
	}
	v, err := d.waitTaskDone(ctx, taskReclaimDead, time.Minute)
	if err != nil {
		return nil, nil, 0, err
	}
	all, ctlAll, err := g.finish(true, 30*time.Second)
	if err != nil {
		return nil, nil, 0, err
	}
	t, ok := v.task(taskReclaimDead)
	if !ok || t.Ended.IsZero() {
		return nil, nil, 0, fmt.Errorf("no finished %s task in /debug/lifecycle: %+v", taskReclaimDead, v.Tasks)
	}
	from, to := max(t.Started.UnixNano(), su.ServingAt.UnixNano()), t.Ended.UnixNano()
	if paced := d.pacedLine(); paced != "" {
		run.ReclaimLog = append(run.ReclaimLog, paced)
	}
	run.ReclaimLog = append(run.ReclaimLog, rep.Line)
	run.Series = latencySeries(all, d.began)
	run.ServingMs, run.ReclaimEndMs = ms(su.Serving), ms(t.Ended.Sub(d.began))
	if f, ok := v.task(taskFill); ok && !f.Ended.IsZero() {
		run.FillEndMs = ms(f.Ended.Sub(d.began))
	}
	kept, control = inWindow(all, from, to), inWindow(ctlAll, from, to)
	run.Reclaim, run.Control = latencyByKind(kept), latencyByKind(control)
	if _, err := d.waitPoolFilled(ctx, 2*time.Minute); err != nil {
		return nil, nil, 0, err
	}
	return kept, control, time.Duration(to - from), nil
}

// loadAfterStart starts the load generators, then a daemon with nothing to
// reclaim; it returns the requests sent in the window from SERVING, and
// those sent in -idle-duration once the daemon has served a second past
// its full pool.
func (r *runner) loadAfterStart(ctx context.Context, window time.Duration, ctl controlServer, p loadProfile) (started, idle []sample, err error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, nil, err
	}
	g, err := r.startLoadgens(addr, ctl, p, loadgenMaxDuration)
	if err != nil {
		return nil, nil, err
	}
	d, su, failures, err := r.startServing(ctx, daemonArgs(r.h, addr, r.o, modeBackground, r.o.poolSize), nil, startTimeout(0, modeBackground))
	if err != nil {
		return nil, nil, err
	}
	if len(failures) > 0 {
		return nil, nil, fmt.Errorf("the daemon failed its start %d times (%s)", len(failures), failures[0])
	}
	started, idle, err = r.collectAfterStart(ctx, d, su, g, window)
	if err != nil {
		d.kill()
		return nil, nil, err
	}
	if _, err := d.stop(); err != nil {
		return nil, nil, err
	}
	return started, idle, r.reset(ctx)
}

func (r *runner) collectAfterStart(ctx context.Context, d *daemon, su startup, g loadgens, window time.Duration) (started, idle []sample, err error) {
	if err := sleep(ctx, window); err != nil {
		return nil, nil, err
	}
	if _, err := d.waitPoolFilled(ctx, 2*time.Minute); err != nil {
		return nil, nil, err
	}
	if err := sleep(ctx, time.Second); err != nil {
		return nil, nil, err
	}
	idleFrom := time.Now()
	if err := sleep(ctx, r.o.idleDuration); err != nil {
		return nil, nil, err
	}
	all, _, err := g.finish(true, 30*time.Second)
	if err != nil {
		return nil, nil, err
	}
	from := su.ServingAt.UnixNano()
	return inWindow(all, from, from+int64(window)), inWindow(all, idleFrom.UnixNano(), time.Now().UnixNano()), nil
}

// inWindow returns the samples sent in [from, to] (Unix ns).
func inWindow(all []sample, from, to int64) []sample {
	return slices.DeleteFunc(slices.Clone(all), func(s sample) bool { return s.At < from || s.At > to })
}

// latencyByKind summarizes samples per request kind.
func latencyByKind(samples []sample) map[string]LatencyStats {
	out := map[string]LatencyStats{}
	for _, kind := range []string{kindGRPC, kindHTTP, kindAcquire} {
		var kept []sample
		for _, s := range samples {
			if s.Kind == kind {
				kept = append(kept, s)
			}
		}
		if len(kept) > 0 {
			out[kind] = latencyOf(kept)
		}
	}
	return out
}

// latencyOf summarizes samples: answered ones by latency, the others
// counted as errors.
func latencyOf(samples []sample) LatencyStats {
	var st LatencyStats
	var lat, lag []float64
	for _, s := range samples {
		st.Requests++
		lag = append(lag, ms(time.Duration(s.Lag)))
		if s.Err != "" {
			st.Errors++
			if st.FirstError == "" {
				st.FirstError = s.Err
			}
			continue
		}
		lat = append(lat, ms(time.Duration(s.Latency)))
		if time.Duration(s.Latency) > time.Second {
			st.Over1s++
		}
	}
	slices.Sort(lat)
	slices.Sort(lag)
	st.P50Ms, st.P99Ms = percentile(lat, 0.50), percentile(lat, 0.99)
	st.LagP99Ms = percentile(lag, 0.99)
	if len(lat) > 0 {
		st.MaxMs = lat[len(lat)-1]
	}
	return st
}

// latencySeries buckets samples by when they were sent, from began.
func latencySeries(samples []sample, began time.Time) []LatencyBucket {
	var health [][]float64
	var out []LatencyBucket
	for _, s := range samples {
		k := int(time.Duration(s.At-began.UnixNano()) / seriesBucket)
		if k < 0 {
			continue
		}
		for len(out) <= k {
			out = append(out, LatencyBucket{})
			health = append(health, nil)
		}
		b := &out[k]
		b.LagMax = max(b.LagMax, ms(time.Duration(s.Lag)))
		switch {
		case s.Err != "":
			b.Errors++
		case s.Kind == kindAcquire:
			b.Acquires++
			b.AcquireMax = max(b.AcquireMax, ms(time.Duration(s.Latency)))
		default:
			health[k] = append(health[k], ms(time.Duration(s.Latency)))
		}
	}
	for k, lat := range health {
		slices.Sort(lat)
		out[k].Health = len(lat)
		out[k].HealthP50, out[k].HealthP99 = percentile(lat, 0.5), percentile(lat, 0.99)
		if len(lat) > 0 {
			out[k].HealthMax = lat[len(lat)-1]
		}
	}
	return out
}
