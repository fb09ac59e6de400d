package export_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/phasegate/phasegate/metrics"
	"github.com/phasegate/phasegate/metrics/export"
)

// names is a service's own metric exporter: it keeps the names of the
// metrics it is pushed, and counts its Shutdowns.
type names struct {
	mu   sync.Mutex
	seen []string
	shut atomic.Int32
}

func (n *names) Temporality(k sdkmetric.InstrumentKind) metricdata.Temporality {
	return sdkmetric.DefaultTemporalitySelector(k)
}

func (n *names) Aggregation(k sdkmetric.InstrumentKind) sdkmetric.Aggregation {
	return sdkmetric.DefaultAggregationSelector(k)
}

func (n *names) Export(_ context.Context, rm *metricdata.ResourceMetrics) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			n.seen = append(n.seen, m.Name)
		}
	}
	return nil
}

func (n *names) ForceFlush(context.Context) error { return nil }

func (n *names) Shutdown(context.Context) error {
	n.shut.Add(1)
	return nil
}

// A service's own push exporter is named in OTEL_METRICS_EXPORTER like the
// ones the specification names; what is left is pushed at Shutdown.
func ExamplePush() {
	pushed := &names{}
	mine := export.Push("names", func(context.Context, metrics.ExportSettings) (sdkmetric.Exporter, error) {
		return pushed, nil
	})
	os.Setenv("OTEL_METRICS_EXPORTER", "names")
	defer os.Unsetenv("OTEL_METRICS_EXPORTER")

	ctx := context.Background()
	mp, err := metrics.Setup(ctx, metrics.WithExporters(mine))
	if err != nil {
		fmt.Println(err)
		return
	}
	reclaimed, _ := mp.Meter("example").Int64Counter("reclaimed")
	reclaimed.Add(ctx, 3)
	if err := mp.Shutdown(ctx); err != nil {
		fmt.Println(err)
	}
	fmt.Println(mp.Exporters, pushed.seen)
	// Output: [names] [reclaimed]
}

// When an exporter fails to open, or the pipelines cannot be joined, the
// exporters already opened are shut, and the error names the one that
// failed. The pull exporter, always there, is opened first.
func TestSetupShutsWhatItOpened(t *testing.T) {
	foreign := metrics.Exporter{Name: "foreign", Open: func(context.Context, metrics.ExportSettings) (metrics.Pipeline, error) {
		return foreignPipeline{}, nil
	}}
	failing := export.Push("failing", func(context.Context, metrics.ExportSettings) (sdkmetric.Exporter, error) {
		return nil, errors.New("no such collector")
	})
	for _, tc := range []struct {
		env, want string
	}{
		{"names,failing", `failing exporter: no such collector`},
		{"names,foreign", `cannot join a pipeline of type export_test.foreignPipeline`},
	} {
		t.Run(tc.env, func(t *testing.T) {
			pushed := &names{}
			mine := export.Push("names", func(context.Context, metrics.ExportSettings) (sdkmetric.Exporter, error) {
				return pushed, nil
			})
			var pulled atomic.Int32
			scraped := export.Pull("scraped", func(context.Context, metrics.ExportSettings) (sdkmetric.Reader, http.Handler, error) {
				pulled.Add(1)
				return sdkmetric.NewManualReader(), http.NotFoundHandler(), nil
			})
			t.Setenv("OTEL_METRICS_EXPORTER", tc.env)
			t.Setenv("OTEL_SDK_DISABLED", "")
			mp, err := metrics.Setup(context.Background(), metrics.WithExporters(scraped, mine, failing, foreign))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Setup: %v, %v; want an error with %q", mp, err, tc.want)
			}
			if n := pushed.shut.Load(); n != 1 {
				t.Errorf("the opened push exporter was shut %d times, want once", n)
			}
			if n := pulled.Load(); n != 1 {
				t.Errorf("the pull exporter was opened %d times, want once", n)
			}
		})
	}
}

// foreignPipeline is a metrics.Pipeline of another package.
type foreignPipeline struct{}

func (foreignPipeline) Handler() http.Handler { return nil }
func (foreignPipeline) Join(context.Context, []metrics.Pipeline) (metrics.Joined, error) {
	return metrics.Joined{}, errors.New("not joinable")
}
func (foreignPipeline) Shutdown(context.Context) error { return nil }
