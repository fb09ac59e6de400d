package app

import (
	"context"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/metrics"
	"github.com/phasegate/phasegate/metrics/prometheus"
	"github.com/phasegate/phasegate/phasetest"
	"github.com/phasegate/phasegate/tracing/grpccalls"
)

type slotsStub struct {
	phasegatev1.UnimplementedSlotsServer
}

func (slotsStub) List(context.Context, *phasegatev1.ListRequest) (*phasegatev1.ListResponse, error) {
	return &phasegatev1.ListResponse{}, nil
}

// The port's gRPC calls are traced and measured by the instrumentation
// that comes with the exporters: with a metric exporter, a call is
// measured in /metrics and traced to the App's tracer provider; with
// none, it is neither, unless the service adds grpccalls itself.
func TestCallsInstrumentedWithTheExporters(t *testing.T) {
	for _, tc := range []struct {
		name       string
		prometheus bool // measured in /metrics, and so traced
		ownCalls   bool // grpccalls in GRPCOptions
		wantSpan   bool
	}{
		{name: "no exporter", wantSpan: false},
		{name: "no exporter, grpccalls given", ownCalls: true, wantSpan: true},
		{name: "prometheus", prometheus: true, wantSpan: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := tracetest.NewSpanRecorder()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
			t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
			cfg := testConfig()
			cfg.TracerProvider = tp
			if tc.prometheus {
				cfg.MetricExporters = []metrics.Exporter{prometheus.Exporter()}
			}
			if tc.ownCalls {
				cfg.GRPCOptions = []grpc.ServerOption{grpccalls.ServerOption(tp, nil)}
			}
			a, err := New(cfg, lifecycle.Phase{Name: "config", Run: nop})
			if err != nil {
				t.Fatal(err)
			}
			if err := a.Server().Declare(&phasegatev1.Slots_ServiceDesc); err != nil {
				t.Fatal(err)
			}
			b := a.Server().Binder()
			phasegatev1.RegisterSlotsServer(b, slotsStub{})
			if err := b.Err(); err != nil {
				t.Fatal(err)
			}
			h := phasetest.Wrap(t, a).RequireStart()
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			addr := a.Addr(ctx)
			conn, err := grpc.NewClient(addr.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if _, err := phasegatev1.NewSlotsClient(conn).List(ctx, &phasegatev1.ListRequest{}); err != nil {
				t.Fatal(err)
			}

			if tc.prometheus {
				// The call is measured when its answer is sent, which
				// the client may see first.
				deadline := time.Now().Add(5 * time.Second)
				for !measuredIn(t, addr) && time.Now().Before(deadline) {
					time.Sleep(10 * time.Millisecond)
				}
				if !measuredIn(t, addr) {
					t.Error("/metrics does not measure the call")
				}
			}
			h.RequireStop() // a call's span ends after its answer, and before the drain ends
			var names []string
			for _, s := range rec.Ended() {
				names = append(names, s.Name())
			}
			if !slices.Contains(names, "startup") {
				t.Fatalf("spans %q: not even the start's", names)
			}
			if traced := slices.Contains(names, "phasegate.v1.Slots/List"); traced != tc.wantSpan {
				t.Errorf("spans %q: the call's there %v, want %v", names, traced, tc.wantSpan)
			}
		})
	}
}

// measuredIn reports whether addr's /metrics holds the Slots List call.
func measuredIn(t *testing.T, addr net.Addr) bool {
	_, body := get(t, addr, PathMetrics)
	return strings.Contains(body, `rpc_server_call_duration_seconds_count{`) && strings.Contains(body, `rpc_method="phasegate.v1.Slots/List"`)
}
