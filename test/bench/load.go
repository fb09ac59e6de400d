package main

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// loadgenMaxDuration bounds a load generator started before a daemon; it is
// interrupted as soon as what it measures is over.
const loadgenMaxDuration = 5 * time.Minute

// seriesBucket is the width of a LoadRun's Series buckets.
const seriesBucket = 250 * time.Millisecond

// measureLoad measures health-check and Acquire latency from separate
// load-generator processes. Each rep starts a daemon on -load-n dead slots
// with the generators already running and keeps what they sent from
// SERVING to the end of the background reclaim; then it starts a daemon
// with nothing to reclaim the same way and keeps the same length of time
// from SERVING (the start's own cost, the baseline that isolates the
// reclaim), and, once that daemon has served a while, -idle-duration of
// idle.
func (r *runner) measureLoad(ctx context.Context) error {
	lr := &LoadResult{N: r.o.loadN, Rate: r.o.rate, AcquireRate: r.o.acquireRate, Reps: r.o.loadReps}
	var reclaiming, started, idle []sample
	for rep := range r.o.loadReps {
		r.sampleLoad()
		var run LoadRun
		s, window, err := r.loadDuringReclaim(ctx, &run)
		if err != nil {
			return err
		}
		reclaiming = append(reclaiming, s...)
		lr.WindowMs = append(lr.WindowMs, ms(window))
		r.logf("load rep %d: %d requests during a %s background reclaim of %d (gRPC p99 %s, Acquire p99 %s)", rep+1, len(s),
			fmtMs(ms(window)), r.o.loadN, fmtMs(run.Reclaim[kindGRPC].P99Ms), fmtMs(run.Reclaim[kindAcquire].P99Ms))
		st, id, err := r.loadAfterStart(ctx, window)
		if err != nil {
			return err
		}
		run.Start, run.Idle = latencyByKind(st), latencyByKind(id)
		started, idle = append(started, st...), append(idle, id...)
		r.logf("load rep %d: %d requests after a start with nothing to reclaim (gRPC p99 %s), %d idle (gRPC p99 %s)", rep+1,
			len(st), fmtMs(run.Start[kindGRPC].P99Ms), len(id), fmtMs(run.Idle[kindGRPC].P99Ms))
		lr.Runs = append(lr.Runs, run)
	}
	lr.Reclaim, lr.Start, lr.Idle = latencyByKind(reclaiming), latencyByKind(started), latencyByKind(idle)
	r.res.Load = lr
	return nil
}

// loadgens are the load part's two generators: health checks and, at a
// modest rate, Acquire calls.
type loadgens struct{ health, acquire *loadgen }

func (r *runner) startLoadgens(addr string, duration time.Duration) (loadgens, error) {
	var g loadgens
	var err error
	if g.health, err = r.startLoadgen(addr, genHealth, r.o.rate, duration); err != nil {
		return g, err
	}
	if r.o.acquireRate > 0 {
		if g.acquire, err = r.startLoadgen(addr, genAcquire, r.o.acquireRate, duration); err != nil {
			return g, err
		}
	}
	return g, nil
}

// finish ends both generators (interrupt: now) and returns their samples.
func (g loadgens) finish(interrupt bool, timeout time.Duration) ([]sample, error) {
	s, err := g.health.finish(interrupt, timeout)
	if err != nil || g.acquire == nil {
		return s, err
	}
	a, err := g.acquire.finish(interrupt, timeout)
	return append(s, a...), err
}

// loadDuringReclaim starts the load generators, then the daemon on -load-n
// dead slots; it keeps the requests sent from SERVING (or the start of the
// reclaim task, if later) to the end of the reclaim task, and fills run.
func (r *runner) loadDuringReclaim(ctx context.Context, run *LoadRun) ([]sample, time.Duration, error) {
	if err := r.leak(ctx, r.o.loadN); err != nil {
		return nil, 0, err
	}
	addr, err := freeAddr()
	if err != nil {
		return nil, 0, err
	}
	g, err := r.startLoadgens(addr, loadgenMaxDuration)
	if err != nil {
		return nil, 0, err
	}
	d, su, failures, err := r.startServing(ctx, daemonArgs(r.h, addr, r.o, modeBackground, r.o.poolSize), nil, startTimeout(r.o.loadN, modeBackground))
	if err != nil {
		return nil, 0, err
	}
	if len(failures) > 0 {
		return nil, 0, fmt.Errorf("the daemon failed its start %d times (%s): the load measured would not be the reclaim's", len(failures), failures[0])
	}
	samples, window, err := r.collectDuringReclaim(ctx, d, su, g, run)
	if err != nil {
		d.kill()
		return nil, 0, err
	}
	if _, err := d.stop(); err != nil {
		return nil, 0, err
	}
	return samples, window, r.reset(ctx)
}

func (r *runner) collectDuringReclaim(ctx context.Context, d *daemon, su startup, g loadgens, run *LoadRun) ([]sample, time.Duration, error) {
	rep, err := d.reclaimReport(ctx, 0, startTimeout(r.o.loadN, modeBackground))
	if err != nil {
		return nil, 0, err
	}
	if rep.Reclaimed != r.o.loadN {
		return nil, 0, fmt.Errorf("reclaim report: reclaimed %d of %d\n%s", rep.Reclaimed, r.o.loadN, d.logs)
	}
	v, err := d.waitTaskDone(ctx, taskReclaimDead, time.Minute)
	if err != nil {
		return nil, 0, err
	}
	all, err := g.finish(true, 30*time.Second)
	if err != nil {
		return nil, 0, err
	}
	t, ok := v.task(taskReclaimDead)
	if !ok || t.Ended.IsZero() {
		return nil, 0, fmt.Errorf("no finished %s task in /debug/lifecycle: %+v", taskReclaimDead, v.Tasks)
	}
	from, to := max(t.Started.UnixNano(), su.ServingAt.UnixNano()), t.Ended.UnixNano()
	run.Series = latencySeries(all, d.began)
	run.ServingMs, run.ReclaimEndMs = ms(su.Serving), ms(t.Ended.Sub(d.began))
	if f, ok := v.task(taskFill); ok && !f.Ended.IsZero() {
		run.FillEndMs = ms(f.Ended.Sub(d.began))
	}
	kept := inWindow(all, from, to)
	run.Reclaim = latencyByKind(kept)
	if _, err := d.waitPoolFilled(ctx, 2*time.Minute); err != nil {
		return nil, 0, err
	}
	return kept, time.Duration(to - from), nil
}

// inWindow returns the samples sent in [from, to] (Unix ns).
func inWindow(all []sample, from, to int64) []sample {
	return slices.DeleteFunc(slices.Clone(all), func(s sample) bool { return s.At < from || s.At > to })
}

// loadAfterStart starts the load generators, then a daemon with nothing to
// reclaim; it returns the requests sent in the window from SERVING, and
// those sent in -idle-duration once the daemon has served a second past
// its full pool.
func (r *runner) loadAfterStart(ctx context.Context, window time.Duration) (started, idle []sample, err error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, nil, err
	}
	g, err := r.startLoadgens(addr, loadgenMaxDuration)
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
	all, err := g.finish(true, 30*time.Second)
	if err != nil {
		return nil, nil, err
	}
	from := su.ServingAt.UnixNano()
	return inWindow(all, from, from+int64(window)), inWindow(all, idleFrom.UnixNano(), time.Now().UnixNano()), nil
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
