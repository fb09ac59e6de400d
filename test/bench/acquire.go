package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/phasegate/phasegate/network/pool"
)

// Sides of the Acquire comparison.
const (
	sideDurable = "durable" // the daemon: the lease recorded before the reply
	sideMemory  = "memory"  // bench memslots: the same service, its records in a map
)

// throughputOwner owns the slots the Acquire comparison leases.
const throughputOwner = "bench-throughput"

// measureAcquire compares Acquire throughput and latency over gRPC on a
// Unix socket with the durable record (the daemon, on its control socket)
// and with the record in a map (`bench memslots`, the same service over the
// same pool and an in-memory store, on a socket of its own). Each rep
// starts each side with a warm pool deep enough for -acquire-n calls
// (burstPool) and makes them from -acquire-clients concurrent callers on
// one connection, so that no call waits for a slot to be made and no slot
// is made beside the calls; the order of the sides alternates from rep to
// rep.
func (r *runner) measureAcquire(ctx context.Context) error {
	res := &AcquireResult{Calls: r.o.acquireN, Clients: r.o.acquireConc, Reps: r.o.reps, WarmPool: burstPool(r.o.acquireN)}
	lat := map[string][]sample{}
	for rep := range r.o.reps {
		sides := []string{sideDurable, sideMemory}
		if rep%2 == 1 {
			slices.Reverse(sides)
		}
		for _, side := range sides {
			r.sampleLoad()
			run, s, err := r.acquireRun(ctx, side, rep)
			if err != nil {
				return fmt.Errorf("%s: %w", side, err)
			}
			lat[side] = append(lat[side], s...)
			sd := map[string]*AcquireSide{sideDurable: &res.Durable, sideMemory: &res.Memory}[side]
			sd.Runs = append(sd.Runs, run)
			r.logf("acquire rep %d %s: %d calls, %.0f/s, p50 %s, p99 %s, max %s, %d errors", rep+1, side, r.o.acquireN,
				run.PerS, fmtMs(run.P50Ms), fmtMs(run.P99Ms), fmtMs(run.MaxMs), run.Errors)
		}
	}
	for side, sd := range map[string]*AcquireSide{sideDurable: &res.Durable, sideMemory: &res.Memory} {
		var xs []float64
		for _, run := range sd.Runs {
			xs = append(xs, run.PerS)
		}
		sd.PerS = summarize(xs)
		sd.Latency = latencyOf(lat[side])
	}
	r.res.Acquire = res
	return nil
}

// burstPool is the warm pool a burst of n Acquires is measured from: the
// smallest that still holds its reserve after the burst, so that neither
// side makes a slot beside it (the pool refills below its reserve at once)
// and the comparison is the record's cost alone. What a burst beyond the
// pool costs is the slotrate part's.
func burstPool(n int) int {
	warm := n
	for warm-n < pool.Reserve(warm) {
		warm++
	}
	return warm
}

// acquireRun starts one side with a warm pool of burstPool(-acquire-n),
// lets the kernel settle, measures one burst, stops it and removes every
// slot.
func (r *runner) acquireRun(ctx context.Context, side string, rep int) (AcquireRun, []sample, error) {
	var run AcquireRun
	addr, err := freeAddr()
	if err != nil {
		return run, nil, err
	}
	n := r.o.acquireN
	warm := burstPool(n)
	fillTimeout := time.Minute + time.Duration(warm)*200*time.Millisecond
	var d *daemon
	if side == sideDurable {
		if d, _, _, err = r.startServing(ctx, daemonArgs(r.h, addr, r.o, modeBackground, warm), nil, startTimeout(0, modeBackground)); err != nil {
			return run, nil, err
		}
		_, err = d.waitPoolFilled(ctx, fillTimeout)
	} else {
		if d, err = r.startMemSlots(warm); err != nil {
			return run, nil, err
		}
		_, err = d.logs.wait(ctx, msgPoolReady, 0, fillTimeout, d.done)
	}
	if err == nil {
		// Making the pool leaves the kernel work to do (RCU callbacks,
		// address configuration) that would run beside the burst.
		err = sleep(ctx, r.o.settle)
	}
	if err != nil {
		d.kill()
		return run, nil, fmt.Errorf("warm pool of %d: %w", warm, err)
	}
	b, err := acquireBurst(ctx, d.slotsTarget(), n, r.o.acquireConc, throughputOwner, fmt.Sprintf("%s-%d", side, rep), 0, nil)
	if err != nil {
		d.kill()
		return run, nil, err
	}
	if _, err := d.stop(); err != nil {
		return run, nil, err
	}
	samples := make([]sample, 0, n)
	for _, l := range b.lat {
		samples = append(samples, sample{Kind: kindAcquire, Latency: int64(l)})
	}
	for range b.errors {
		samples = append(samples, sample{Kind: kindAcquire, Err: b.firstErr})
	}
	st := latencyOf(samples)
	run = AcquireRun{PerS: float64(len(b.lat)) / b.elapsed.Seconds(), P50Ms: st.P50Ms, P99Ms: st.P99Ms, MaxMs: st.MaxMs, Errors: b.errors}
	return run, samples, r.reset(ctx)
}

// startMemSlots re-execs this binary as `memslots` on our slots, serving
// on a socket in the host's directory.
func (r *runner) startMemSlots(poolSize int) (*daemon, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("memslots: %w", err)
	}
	args := []string{"memslots", "--control-socket=" + filepath.Join(r.h.base, "memslots.sock"),
		"--netns-dir=" + r.h.cfg.NetnsDir, "--slot-prefix=" + r.h.cfg.Prefix,
		"--slots=" + strconv.Itoa(r.h.cfg.Slots), "--slot-cidr=" + r.h.cfg.CIDR.String(),
		"--pool-size=" + strconv.Itoa(poolSize), "--reclaim-workers=" + strconv.Itoa(r.o.workers)}
	d, err := startDaemon(self, args, nil)
	if err != nil {
		return nil, err
	}
	r.track(d.kill)
	return d, nil
}
