package export_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/phasegate/phasegate/tracing"
	"github.com/phasegate/phasegate/tracing/export"
)

// names is a service's own span exporter: it keeps the names of the
// spans it is given.
type names struct {
	mu   sync.Mutex
	seen []string
}

func (n *names) ExportSpans(_ context.Context, spans []sdktrace.ReadOnlySpan) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, s := range spans {
		n.seen = append(n.seen, s.Name())
	}
	return nil
}

func (n *names) Shutdown(context.Context) error { return nil }

// A service's own exporter is named in OTEL_TRACES_EXPORTER like the two
// the specification names.
func ExampleExporter() {
	spans := &names{}
	mine := export.Exporter("names", func(context.Context, tracing.ExportSettings) (sdktrace.SpanExporter, error) {
		return spans, nil
	})
	os.Setenv("OTEL_TRACES_EXPORTER", "names")
	defer os.Unsetenv("OTEL_TRACES_EXPORTER")

	ctx := context.Background()
	tp, err := tracing.Setup(ctx, tracing.WithExporters(mine))
	if err != nil {
		fmt.Println(err)
		return
	}
	_, span := tp.Tracer("example").Start(ctx, "reclaim")
	span.End()
	if err := tp.Shutdown(ctx); err != nil { // flushes
		fmt.Println(err)
	}
	fmt.Println(tp.Exporter, spans.seen)
	// Output: names [reclaim]
}

// shutCounter is an in-memory exporter that counts its Shutdowns.
type shutCounter struct {
	*tracetest.InMemoryExporter
	shut atomic.Int32
}

func (e *shutCounter) Shutdown(ctx context.Context) error {
	e.shut.Add(1)
	return e.InMemoryExporter.Shutdown(ctx)
}

// When an exporter fails to open, or the pipelines cannot be joined, the
// exporters already opened are shut, and the error names the one that
// failed.
func TestSetupShutsWhatItOpened(t *testing.T) {
	foreign := tracing.Exporter{Name: "foreign", Open: func(context.Context, tracing.ExportSettings) (tracing.Pipeline, error) {
		return foreignPipeline{}, nil
	}}
	failing := export.Exporter("failing", func(context.Context, tracing.ExportSettings) (sdktrace.SpanExporter, error) {
		return nil, errors.New("no such collector")
	})
	for _, tc := range []struct {
		env, want string
	}{
		{"memory,failing", `failing exporter: no such collector`},
		{"memory,foreign", `cannot join a pipeline of type export_test.foreignPipeline`},
	} {
		t.Run(tc.env, func(t *testing.T) {
			mem := &shutCounter{InMemoryExporter: tracetest.NewInMemoryExporter()}
			memory := export.Exporter("memory", func(context.Context, tracing.ExportSettings) (sdktrace.SpanExporter, error) {
				return mem, nil
			})
			t.Setenv("OTEL_TRACES_EXPORTER", tc.env)
			t.Setenv("OTEL_SDK_DISABLED", "")
			tp, err := tracing.Setup(context.Background(), tracing.WithExporters(memory, failing, foreign))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Setup: %v, %v; want an error with %q", tp, err, tc.want)
			}
			if n := mem.shut.Load(); n != 1 {
				t.Errorf("the opened exporter was shut %d times, want once", n)
			}
		})
	}
}

// foreignPipeline is a tracing.Pipeline of another package.
type foreignPipeline struct{}

func (foreignPipeline) Join(context.Context, []tracing.Pipeline) (tracing.Joined, error) {
	return tracing.Joined{}, errors.New("not joinable")
}
func (foreignPipeline) Shutdown(context.Context) error { return nil }
