package main

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// loadgenMaxDuration bounds a load generator started before a reclaiming
// daemon; it is interrupted as soon as the daemon serves.
const loadgenMaxDuration = 2 * time.Minute

// measureLoad measures health-check latency from a separate load-generator
// process at a fixed rate, alternately while a daemon reclaims o.loadN
// leaked slots (requests sent during the reclaim phase count) and against an
// idle, serving daemon.
func (r *runner) measureLoad(ctx context.Context) error {
	var reclaiming, idle []sample
	lr := &LoadResult{N: r.o.loadN, Rate: r.o.rate, Reps: r.o.loadReps}
	for rep := range r.o.loadReps {
		r.res.Machine.sampleLoad()
		s, window, err := r.loadDuringReclaim(ctx)
		if err != nil {
			return err
		}
		reclaiming = append(reclaiming, s...)
		lr.WindowMs = append(lr.WindowMs, ms(window))
		r.logf("load rep %d: %d requests during a %s reclaim", rep+1, len(s), fmtMs(ms(window)))
		if s, err = r.loadIdle(ctx); err != nil {
			return err
		}
		idle = append(idle, s...)
		r.logf("load rep %d: %d requests against the idle daemon", rep+1, len(s))
	}
	lr.Reclaim = latencyByKind(reclaiming)
	lr.Idle = latencyByKind(idle)
	r.res.Load = lr
	return nil
}

// loadDuringReclaim starts the load generator, then the daemon on o.loadN
// leaked slots; it keeps the requests sent while the reclaim phase ran.
func (r *runner) loadDuringReclaim(ctx context.Context) ([]sample, time.Duration, error) {
	if err := r.leak(ctx, r.o.loadN); err != nil {
		return nil, 0, err
	}
	addr, err := freeAddr()
	if err != nil {
		return nil, 0, err
	}
	g, err := startLoadgen(r.h.base, addr, r.o.rate, loadgenMaxDuration)
	if err != nil {
		return nil, 0, err
	}
	d, err := startDaemon(r.bin, daemonArgs(r.h, addr, r.o, false))
	if err != nil {
		g.kill()
		return nil, 0, err
	}
	samples, window, err := r.collectDuringReclaim(ctx, d, g)
	if err != nil {
		g.kill()
		d.kill()
		return nil, 0, err
	}
	if err := d.stop(); err != nil {
		return nil, 0, err
	}
	return samples, window, r.h.settle(ctx, r.o.settle)
}

// collectDuringReclaim waits for the daemon to serve, stops the load
// generator and keeps its samples sent inside the reclaim phase.
func (r *runner) collectDuringReclaim(ctx context.Context, d *daemon, g *loadgen) ([]sample, time.Duration, error) {
	if _, err := d.measureStartup(ctx, startTimeout(r.o.loadN, false)); err != nil {
		return nil, 0, err
	}
	v, err := d.lifecycle(ctx)
	if err != nil {
		return nil, 0, err
	}
	all, err := g.finish(true, 30*time.Second)
	if err != nil {
		return nil, 0, err
	}
	i := slices.IndexFunc(v.Phases, func(p phaseView) bool { return p.Name == "reclaim" })
	if i < 0 || v.Phases[i].Ended.IsZero() {
		return nil, 0, fmt.Errorf("no finished reclaim phase in /debug/lifecycle: %+v", v.Phases)
	}
	from, to := v.Phases[i].Started.UnixNano(), v.Phases[i].Ended.UnixNano()
	var kept []sample
	for _, s := range all {
		if s.At >= from && s.At <= to {
			kept = append(kept, s)
		}
	}
	if _, err := d.waitPoolFilled(ctx); err != nil {
		return nil, 0, err
	}
	return kept, time.Duration(to - from), nil
}

// loadIdle starts a daemon with nothing to reclaim, waits until it serves
// with a full pool, then runs the load generator for o.idleDuration.
func (r *runner) loadIdle(ctx context.Context) ([]sample, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	d, err := startDaemon(r.bin, daemonArgs(r.h, addr, r.o, false))
	if err != nil {
		return nil, err
	}
	samples, err := r.collectIdle(ctx, d)
	if err != nil {
		d.kill()
		return nil, err
	}
	if err := d.stop(); err != nil {
		return nil, err
	}
	return samples, r.h.settle(ctx, r.o.settle)
}

func (r *runner) collectIdle(ctx context.Context, d *daemon) ([]sample, error) {
	if _, err := d.measureStartup(ctx, startTimeout(0, false)); err != nil {
		return nil, err
	}
	if _, err := d.waitPoolFilled(ctx); err != nil {
		return nil, err
	}
	g, err := startLoadgen(r.h.base, d.addr, r.o.rate, r.o.idleDuration)
	if err != nil {
		return nil, err
	}
	return g.finish(false, r.o.idleDuration+time.Minute)
}

// latencyByKind summarizes samples per request kind.
func latencyByKind(samples []sample) map[string]LatencyStats {
	out := map[string]LatencyStats{}
	for _, kind := range []string{kindGRPC, kindHTTP} {
		var st LatencyStats
		var lat []float64
		for _, s := range samples {
			if s.Kind != kind {
				continue
			}
			st.Requests++
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
		st.P50Ms, st.P99Ms = percentile(lat, 0.50), percentile(lat, 0.99)
		if len(lat) > 0 {
			st.MaxMs = lat[len(lat)-1]
		}
		out[kind] = st
	}
	return out
}
