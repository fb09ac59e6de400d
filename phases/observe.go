package phases

import (
	"context"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
	"github.com/phasegate/phasegate/network/pool"
	"github.com/phasegate/phasegate/network/reclaim"
	"github.com/phasegate/phasegate/network/reconcile"
	"github.com/phasegate/phasegate/phases/lease"
	"github.com/phasegate/phasegate/phases/slotsapi"
	"github.com/phasegate/phasegate/server"
)

// meterScope is the instrumentation scope of the daemon's own instruments.
const meterScope = "github.com/phasegate/phasegate/phases"

// observer holds the daemon's own metrics, beside those the App keeps for
// every service (phases, health checks, gRPC calls):
//
//	phasegate.slot.acquire.duration   histogram, s   code     Slots/Acquire latency
//	phasegate.reclaim.slots           counter        result   found, reclaimed, failed, deferred
//	phasegate.pool.size               gauge                   the target number of warm slots
//	phasegate.pool.slots              gauge          state    idle, acquired, creating; free, quarantined (indices)
//	phasegate.restore.slots           counter        result   restored, adopted, lost, held (each start)
//	phasegate.lease.events            counter        event    acquired, released, expired, expiry_deferred, lost, repaired (broken from outside)
//	phasegate.leases                  gauge          state    held, lost
//	phasegate.lease.traffic           counter, By    direction  in, out: what the leased slots' links carried
//	phasegate.lease.packets           counter        direction  in, out
//	phasegate.reconcile.passes        counter        result   ok, failed
//	phasegate.reconcile.slots         counter        result   claimed, freed
//	phasegate.conns.open              gauge          surface  connections open on the port, the socket
//	phasegate.conns.refused           counter        surface, reason  per_peer, total, sniffing, admission (closed at accept), protocol, accept_failed (no descriptor)
type observer struct {
	meter     metric.Meter
	acquire   metric.Float64Histogram
	reclaim   metric.Int64Counter
	restore   metric.Int64Counter
	leaseEv   metric.Int64Counter
	passes    metric.Int64Counter
	reconcile metric.Int64Counter

	// acquireWait, when set, observes every Acquire's time for the
	// background reclaim's pace.
	acquireWait *waitGauge

	mu       sync.Mutex
	poolReg  metric.Registration
	leaseReg metric.Registration
	connsReg metric.Registration
	servers  map[string]*server.Server // by surface, for the connection instruments
}

// init makes the instruments on mp. The observer exists before (its
// interceptor goes into the App's options); calls timed before init are
// not recorded.
func (o *observer) init(mp metric.MeterProvider) error {
	o.meter = mp.Meter(meterScope)
	var err error
	if o.acquire, err = o.meter.Float64Histogram("phasegate.slot.acquire.duration", metric.WithUnit("s"),
		metric.WithDescription("Latency of Slots/Acquire calls, by gRPC status code."),
		metric.WithExplicitBucketBoundaries(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)); err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	for _, c := range []struct {
		dst        *metric.Int64Counter
		name, what string
	}{
		{&o.reclaim, "phasegate.reclaim.slots", "Leaked slots found by reclaim, and how many were reclaimed, failed or deferred to the reconciler."},
		{&o.restore, "phasegate.restore.slots", "Slots found at a start: leases restored, idle slots adopted, leases lost, unknown slots held in safe mode."},
		{&o.leaseEv, "phasegate.lease.events", "Leases acquired, released and expired; leased slots found broken from outside the daemon, lost or repaired."},
		{&o.passes, "phasegate.reconcile.passes", "Reconciler passes, by result (ok, failed): alert on failed."},
		{&o.reconcile, "phasegate.reconcile.slots", "Slots the reconciler claimed (strays found) and freed."},
	} {
		if *c.dst, err = o.meter.Int64Counter(c.name, metric.WithDescription(c.what)); err != nil {
			return fmt.Errorf("metrics: %w", err)
		}
	}
	return o.initConns()
}

// initConns makes the connection instruments, which read the servers
// watchConns names.
func (o *observer) initConns() error {
	open, err := o.meter.Int64ObservableGauge("phasegate.conns.open",
		metric.WithDescription("Connections open, by surface (port, socket)."))
	if err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	sniffing, err := o.meter.Int64ObservableGauge("phasegate.conns.sniffing",
		metric.WithDescription("Connections accepted whose protocol (gRPC or HTTP) is not known yet, by surface."))
	if err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	refused, err := o.meter.Int64ObservableCounter("phasegate.conns.refused",
		metric.WithDescription("Connections not taken, by surface and reason: per_peer, total and sniffing (over a bound, closed at accept), protocol (closed before its protocol was known for what it sent: more than the bound, or a frame no client sends first), admission (closed at accept: on the control socket, a uid the policy grants nothing), accept_failed (an accept that failed for want of descriptors)."))
	if err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	o.connsReg, err = o.meter.RegisterCallback(func(_ context.Context, ob metric.Observer) error {
		o.mu.Lock()
		defer o.mu.Unlock()
		for surface, srv := range o.servers {
			st := srv.ConnStats()
			at := attribute.String("surface", surface)
			ob.ObserveInt64(open, int64(st.Open), metric.WithAttributes(at))
			ob.ObserveInt64(sniffing, int64(st.Sniffing), metric.WithAttributes(at))
			for reason, n := range map[string]uint64{"per_peer": st.RefusedPerPeer, "total": st.RefusedTotal, "sniffing": st.RefusedSniffing,
				"protocol": st.RefusedProtocol, "accept_failed": st.AcceptErrors, "admission": st.RefusedAdmission} {
				ob.ObserveInt64(refused, int64(n), metric.WithAttributes(at, attribute.String("reason", reason)))
			}
		}
		return nil
	}, open, sniffing, refused)
	if err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	return nil
}

// watchConns reports srv's connections under surface.
func (o *observer) watchConns(surface string, srv *server.Server) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.servers == nil {
		o.servers = map[string]*server.Server{}
	}
	o.servers[surface] = srv
}

func (o *observer) add(c metric.Int64Counter, key, value string, n int) {
	if c != nil && n > 0 {
		c.Add(context.Background(), int64(n), metric.WithAttributes(attribute.String(key, value)))
	}
}

// unreadable counts netns entries a start could not inspect.
func (o *observer) unreadable(n int) { o.add(o.reclaim, "result", "unreadable", n) }

// restored counts what a start found.
func (o *observer) restored(p *restorePlan) {
	o.add(o.restore, "result", "adopted", len(p.adopted))
	o.add(o.restore, "result", "lost", len(p.lost))
	o.add(o.restore, "result", "held", len(p.held))
}

// verified counts restored leases as their check settles them: intact
// (restored) or lost.
func (o *observer) verified(intact, lost int) {
	o.add(o.restore, "result", "restored", intact)
	o.add(o.restore, "result", "lost", lost)
}

// reconciled counts a reconcile pass.
func (o *observer) reconciled(p reconcile.Pass) {
	result := "ok"
	if p.Err != nil {
		result = "failed"
	}
	o.add(o.passes, "result", result, 1)
	o.add(o.reconcile, "result", "claimed", len(p.Claimed))
	o.add(o.reconcile, "result", "freed", len(p.Freed))
	o.add(o.reconcile, "result", "failed", len(p.Failed))
	o.add(o.reconcile, "result", "unreadable", len(p.Unreadable))
	o.add(o.reconcile, "result", "beyond", len(p.Beyond))
}

// setLeases starts reporting the lease gauge.
func (o *observer) setLeases(s *lease.Service) {
	o.registerOnce(&o.leaseReg, func() (metric.Registration, error) {
		g, err := o.meter.Int64ObservableGauge("phasegate.leases", metric.WithDescription("Leases held now, and how many of them were lost across a restart."))
		if err != nil {
			return nil, err
		}
		bytes, err := o.meter.Int64ObservableCounter("phasegate.lease.traffic", metric.WithUnit("By"),
			metric.WithDescription("Bytes the leased slots' links carried, by direction (in: into the slots, out: out of them), as the daemon read their kernel counters: at each reconcile pass, Get, List and a lease's end."))
		if err != nil {
			return nil, err
		}
		packets, err := o.meter.Int64ObservableCounter("phasegate.lease.packets",
			metric.WithDescription("Packets the leased slots' links carried, by direction, read as phasegate.lease.traffic is."))
		if err != nil {
			return nil, err
		}
		in, out := metric.WithAttributes(attribute.String("direction", "in")), metric.WithAttributes(attribute.String("direction", "out"))
		return o.meter.RegisterCallback(func(_ context.Context, ob metric.Observer) error {
			held, lost := s.Counts()
			ob.ObserveInt64(g, int64(held-lost), metric.WithAttributes(attribute.String("state", "held")))
			ob.ObserveInt64(g, int64(lost), metric.WithAttributes(attribute.String("state", "lost")))
			t := s.Traffic()
			ob.ObserveInt64(bytes, int64(t.BytesIn), in)
			ob.ObserveInt64(bytes, int64(t.BytesOut), out)
			ob.ObserveInt64(packets, int64(t.PacketsIn), in)
			ob.ObserveInt64(packets, int64(t.PacketsOut), out)
			return nil
		}, g, bytes, packets)
	})
}

// registerOnce sets *reg to what register makes, unless it is set. The
// gauges' sources (the pool, the lease service) are set once each, but
// a restarted phase may set one again. The SDK fails only on invalid
// instrument names, which these are not; a failure leaves the gauges
// unreported rather than failing the start.
func (o *observer) registerOnce(reg *metric.Registration, register func() (metric.Registration, error)) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if *reg != nil {
		return
	}
	if r, err := register(); err == nil {
		*reg = r
	}
}

// grpcOptions time Acquire calls.
func (o *observer) grpcOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.ChainUnaryInterceptor(o.timeAcquire)}
}

const acquireMethod = phasegatev1.Slots_Acquire_FullMethodName

func (o *observer) timeAcquire(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if info.FullMethod != acquireMethod {
		return handler(ctx, req)
	}
	start := time.Now()
	resp, err := handler(ctx, req)
	if o.acquireWait != nil {
		o.acquireWait.observe(time.Since(start))
	}
	if o.acquire == nil {
		return resp, err
	}
	o.acquire.Record(context.Background(), time.Since(start).Seconds(),
		metric.WithAttributes(attribute.String("code", slotsapi.Convert(err).Code().String())))
	return resp, err
}

// reclaimed counts a reclaim report.
func (o *observer) reclaimed(rep *reclaim.Report) {
	ctx := context.Background()
	add := func(result string, n int) {
		o.reclaim.Add(ctx, int64(n), metric.WithAttributes(attribute.String("result", result)))
	}
	add("found", rep.Found)
	add("reclaimed", len(rep.Reclaimed))
	add("failed", len(rep.Failed))
	add("deferred", len(rep.Deferred))
	add("beyond", len(rep.Beyond))
}

// setPool starts reporting the pool's gauges.
func (o *observer) setPool(p *pool.Pool) {
	o.registerOnce(&o.poolReg, func() (metric.Registration, error) {
		size, err := o.meter.Int64ObservableGauge("phasegate.pool.size", metric.WithDescription("Warm slots the pool keeps ready (--pool-size)."))
		if err != nil {
			return nil, err
		}
		slots, err := o.meter.Int64ObservableGauge("phasegate.pool.slots", metric.WithDescription("Slots of the pool by state: idle (warm), acquired, creating; and the indices free (a warm slot can be made there) and quarantined. Idle and free both 0: the node is full, an Acquire fails until a lease ends."))
		if err != nil {
			return nil, err
		}
		return o.meter.RegisterCallback(func(_ context.Context, ob metric.Observer) error {
			lv := p.Level() // counts only: a scrape costs nothing per lease
			ob.ObserveInt64(size, int64(lv.Target))
			for state, n := range map[string]int{"idle": lv.Idle, "acquired": lv.InUse, "creating": lv.Creating,
				"free": lv.Free, "quarantined": lv.Quarantined} {
				ob.ObserveInt64(slots, int64(n), metric.WithAttributes(attribute.String("state", state)))
			}
			return nil
		}, size, slots)
	})
}

// close unregisters the pool's gauges.
func (o *observer) close() {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, r := range []*metric.Registration{&o.poolReg, &o.leaseReg, &o.connsReg} {
		if *r != nil {
			_ = (*r).Unregister()
			*r = nil
		}
	}
}
