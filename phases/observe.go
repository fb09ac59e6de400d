package phases

import (
	"context"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/phasegate/phasegate/network/pool"
	"github.com/phasegate/phasegate/network/reclaim"
)

// meterScope is the instrumentation scope of the daemon's own instruments.
const meterScope = "github.com/phasegate/phasegate/phases"

// observer holds the daemon's own metrics, beside those the App keeps for
// every service (phases, health checks, gRPC calls):
//
//	phasegate.slot.acquire.duration   histogram, s   code     Slots/Acquire latency
//	phasegate.reclaim.slots           counter        result   found, reclaimed, failed, deferred
//	phasegate.pool.size               gauge                   the target number of warm slots
//	phasegate.pool.slots              gauge          state    idle, acquired, creating
type observer struct {
	meter   metric.Meter
	acquire metric.Float64Histogram
	reclaim metric.Int64Counter

	mu      sync.Mutex
	poolReg metric.Registration
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
	if o.reclaim, err = o.meter.Int64Counter("phasegate.reclaim.slots",
		metric.WithDescription("Leaked slots found by reclaim, and how many were reclaimed, failed or deferred to the reconciler.")); err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	return nil
}

// grpcOptions time Acquire calls.
func (o *observer) grpcOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.ChainUnaryInterceptor(o.timeAcquire)}
}

const acquireMethod = "/" + slotsServiceName + "/Acquire"

func (o *observer) timeAcquire(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if info.FullMethod != acquireMethod {
		return handler(ctx, req)
	}
	start := time.Now()
	resp, err := handler(ctx, req)
	if o.acquire == nil {
		return resp, err
	}
	o.acquire.Record(context.Background(), time.Since(start).Seconds(),
		metric.WithAttributes(attribute.String("code", status.Code(err).String())))
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
}

// setPool starts reporting the pool's gauges.
func (o *observer) setPool(p *pool.Pool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.poolReg != nil {
		return
	}
	size, err1 := o.meter.Int64ObservableGauge("phasegate.pool.size", metric.WithDescription("Warm slots the pool keeps ready (--pool-size)."))
	slots, err2 := o.meter.Int64ObservableGauge("phasegate.pool.slots", metric.WithDescription("Slots of the pool by state: idle (warm), acquired, creating."))
	if err1 != nil || err2 != nil {
		return // the SDK only fails on invalid names, which these are not
	}
	o.poolReg, _ = o.meter.RegisterCallback(func(_ context.Context, ob metric.Observer) error {
		s := p.Snapshot()
		ob.ObserveInt64(size, int64(s.Target))
		for state, n := range map[string]int{"idle": len(s.Idle), "acquired": len(s.InUse), "creating": len(s.Creating)} {
			ob.ObserveInt64(slots, int64(n), metric.WithAttributes(attribute.String("state", state)))
		}
		return nil
	}, size, slots)
}

// close unregisters the pool's gauges.
func (o *observer) close() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.poolReg != nil {
		_ = o.poolReg.Unregister()
		o.poolReg = nil
	}
}
