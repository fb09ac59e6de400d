package phases

import (
	"context"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/phasegate/phasegate/network/pool"
	"github.com/phasegate/phasegate/network/reclaim"
	"github.com/phasegate/phasegate/network/slot"
)

// The background reclaim of the dead is paced by what it does to the rest
// of the daemon (reclaim.Pacer): these are the waits it answers to, each
// measured by the daemon itself, and their targets.
const (
	// A health answer takes microseconds of work; what makes one slow
	// while the kernel destroys namespaces is its wait for a CPU, which
	// the lag probe measures: how late a goroutine that asked to wake up
	// gets to run, as the goroutine that accepts a check's connection or
	// reads its request does. The goal is a check's p99 within 1.5× of a
	// bare server's on the same machine, a few milliseconds
	// (docs/BENCHMARKS.md), so the target is a few milliseconds of lag too:
	// the worst of a batch's probes, about the p99 of as many checks.
	healthLagTarget = 5 * time.Millisecond
	lagProbeEvery   = 10 * time.Millisecond
	// An Acquire and a slot creation wait on the networking lock the
	// kernel holds while it destroys a batch.
	acquireWaitTarget = 50 * time.Millisecond
	createWaitTarget  = 50 * time.Millisecond
)

// reclaimNice is the nice value of the background reclaim's worker
// threads. Their work is the kernel's, done in their threads (a detach
// waits for an expedited RCU grace period; a namespace's last reference
// queues its clean-up), and the scheduler would weigh them like the
// threads that answer health checks: a check waited behind them, where a
// bare server on the same machine did not (docs/BENCHMARKS-HISTORY.md,
// "The pace"). At nice 10 a worker weighs a tenth of a handler; on an idle
// machine it runs as fast. Measured since, nice 0 gave the same check
// latency: what the checks had waited behind was mostly the Ps the workers
// held (reclaimProcs).
const reclaimNice = 10

// reclaimProcs raises GOMAXPROCS by half the background reclaim's
// workers for as long as it runs, and returns what puts it back. A worker
// spends most of its time in the kernel (a detach waits out an RCU grace
// period, an unlink queues the namespace's clean-up), and a goroutine in a
// system call keeps its P until the runtime's monitor takes it back, up to
// milliseconds later: with as many Ps as CPUs the health handlers queued
// behind the workers, where a bare server beside the daemon did not
// (figures: docs/BENCHMARKS.md, "Figures behind the network code"; the
// runs: docs/BENCHMARKS-HISTORY.md, "Health under load: the workers held
// the Ps").
// Outside the reclaim GOMAXPROCS stays at the runtime's default, which
// serves a CPU-bound burst of Acquires faster than spare Ps do. An
// operator's GOMAXPROCS is raised the same way and put back as it was.
func reclaimProcs(workers int) (restore func()) {
	prev := runtime.GOMAXPROCS(0)
	runtime.GOMAXPROCS(prev + max(workers/2, 1))
	return func() {
		if os.Getenv("GOMAXPROCS") != "" {
			runtime.GOMAXPROCS(prev)
			return
		}
		runtime.SetDefaultGOMAXPROCS() // back to the default, and its updates
	}
}

// Names of the pace's signals, as in the reclaim's log line.
const (
	signalHealth  = "health"
	signalAcquire = "acquire"
	signalCreate  = "create"
)

// waitGauge keeps the longest wait observed since it was last taken. It is
// lock-free: Acquire and every slot creation observe into it.
type waitGauge struct{ worst atomic.Int64 }

func (g *waitGauge) observe(d time.Duration) {
	for {
		cur := g.worst.Load()
		if int64(d) <= cur || g.worst.CompareAndSwap(cur, int64(d)) {
			return
		}
	}
}

// take returns the longest wait since the last take and starts over.
func (g *waitGauge) take() time.Duration { return time.Duration(g.worst.Swap(0)) }

// observed reports whether a wait was observed since the last take.
func (g *waitGauge) observed() bool { return g.worst.Load() > 0 }

// waits are the daemon's waits the background reclaim is paced by.
type waits struct {
	health, acquire, create waitGauge
	checks                  atomic.Int64 // health answers since the last healthWorst
}

// checked counts a health answer (HTTP or gRPC Check).
func (w *waits) checked() { w.checks.Add(1) }

// healthWorst is the lag probe's worst since the last call if a health
// check was answered meanwhile, and 0 otherwise: the lag of a machine busy
// with other work slows the reclaim only when somebody waits for an answer.
func (w *waits) healthWorst() time.Duration {
	lag := w.health.take()
	if w.checks.Swap(0) == 0 {
		return 0
	}
	return lag
}

// checking reports whether a health check was answered since the last
// healthWorst: a checker is asking now.
func (w *waits) checking() bool { return w.checks.Load() > 0 }

// countChecks is a gRPC interceptor that counts health Checks.
func (w *waits) countChecks(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if info.FullMethod == healthpb.Health_Check_FullMethodName {
		defer w.checked()
	}
	return h(ctx, req)
}

// createWorst is the longest slot creation since the last call if the
// pool is short of its ready floor now (short reports it), and 0
// otherwise: a creation that fills the pool above --pool-min-ready is
// nobody's wait (an Acquire that waits for one on an empty pool counts in
// the acquire signal), and slowing the reclaim for it only made both take
// longer.
func (w *waits) createWorst(short func() bool) time.Duration {
	worst := w.create.take()
	if !short() {
		return 0
	}
	return worst
}

// signals returns the reclaim's pace signals over w; short reports
// whether the pool holds fewer warm slots than its ready floor.
func (w *waits) signals(short func() bool) []reclaim.Signal {
	return []reclaim.Signal{
		{Name: signalHealth, Target: healthLagTarget, Worst: w.healthWorst, Waiting: w.checking},
		{Name: signalAcquire, Target: acquireWaitTarget, Worst: w.acquire.take, Waiting: w.acquire.observed},
		{Name: signalCreate, Target: createWaitTarget, Worst: func() time.Duration { return w.createWorst(short) },
			Waiting: func() bool { return w.create.observed() && short() }},
	}
}

// probeLag measures, until ctx ends, how late a goroutine that sleeps for
// lagProbeEvery wakes up, into w.health. The caller waits for it to end.
func (w *waits) probeLag(ctx context.Context) {
	t0 := time.Now() // before the timer is set: it never fires before t0 + lagProbeEvery
	t := time.NewTimer(lagProbeEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		w.health.observe(time.Since(t0) - lagProbeEvery)
		t0 = time.Now()
		t.Reset(lagProbeEvery)
	}
}

// timedSlots is the pool's slot manager with every creation's time
// observed into create.
type timedSlots struct {
	pool.Slots
	create *waitGauge
}

func (t timedSlots) Create(ctx context.Context, i int) (*slot.Slot, error) {
	t0 := time.Now()
	s, err := t.Slots.Create(ctx, i)
	t.create.observe(time.Since(t0))
	return s, err
}

// newPacer returns the background reclaim's pacer and starts the lag
// probe; stop ends the probe.
func (d *Daemon) newPacer() (p *reclaim.Pacer, stop func(), err error) {
	short := func() bool { return len(d.pool.Snapshot().Idle) < d.cfg.PoolMinReady }
	p, err = reclaim.NewPacer(reclaim.PaceOptions{Signals: d.waits.signals(short)})
	if err != nil {
		return nil, nil, err
	}
	// What waited before the reclaim (the first warm slots) is not its
	// doing.
	d.waits.acquire.take()
	d.waits.create.take()
	d.waits.healthWorst()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { d.waits.probeLag(ctx) })
	return p, func() { cancel(); wg.Wait() }, nil
}
