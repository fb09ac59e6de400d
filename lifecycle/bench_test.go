package lifecycle_test

import (
	"context"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/phasegate/phasegate/lifecycle"
)

// sevenPhases is the daemon's graph (DESIGN.md section 3) with no-op bodies.
func sevenPhases() []lifecycle.Phase {
	return []lifecycle.Phase{
		{Name: "lock", Run: nop},
		{Name: "listen", DependsOn: []string{"lock"}, Run: nop},
		{Name: "reclaim", DependsOn: []string{"lock"}, Run: nop},
		{Name: "storage", DependsOn: []string{"reclaim"}, Run: nop},
		{Name: "populate", DependsOn: []string{"storage"}, Run: nop},
		{Name: "register", DependsOn: []string{"listen", "populate"}, Run: nop},
		{Name: "serve", DependsOn: []string{"register"}, Run: nop},
	}
}

// BenchmarkStartSevenPhases measures New + Start of the seven no-op phases:
// the engine's whole overhead on a daemon's start.
func BenchmarkStartSevenPhases(b *testing.B) {
	phases := sevenPhases()
	run := func(b *testing.B, opts ...lifecycle.Option) {
		b.ReportAllocs()
		for b.Loop() {
			lc, err := lifecycle.New(phases, opts...)
			if err != nil {
				b.Fatal(err)
			}
			if err := lc.Start(context.Background()); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("tracing=off", func(b *testing.B) { run(b) })
	b.Run("tracing=recorder", func(b *testing.B) {
		rec := tracetest.NewSpanRecorder()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
		defer func() { _ = tp.Shutdown(context.Background()) }()
		run(b, lifecycle.WithTracerProvider(tp))
		b.StopTimer()
		if n := len(rec.Ended()); n < 8*b.N {
			b.Fatalf("recorded %d spans for %d starts", n, b.N)
		}
	})
}
