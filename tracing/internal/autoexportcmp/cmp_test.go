package autoexportcmp

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/otlptranslator"
	"go.opentelemetry.io/contrib/exporters/autoexport"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/phasegate/phasegate/metrics"
	metricsconsole "github.com/phasegate/phasegate/metrics/console"
	metricsotlp "github.com/phasegate/phasegate/metrics/otlp"
	metricsprom "github.com/phasegate/phasegate/metrics/prometheus"
	"github.com/phasegate/phasegate/tracing"
	tracingconsole "github.com/phasegate/phasegate/tracing/console"
	tracingotlp "github.com/phasegate/phasegate/tracing/otlp"
)

func clearEnv(tb testing.TB) {
	for _, k := range []string{
		"OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER",
		"OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
		"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_PROMETHEUS_HOST", "OTEL_EXPORTER_PROMETHEUS_PORT",
		"OTEL_METRICS_PRODUCERS", "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES",
	} {
		tb.Setenv(k, "")
	}
}

// What autoexport v0.72.0 does with the settings phasegate honours. Each
// case is a reason the tracing and metrics packages read OTEL_* themselves.
func TestAutoexportFacts(t *testing.T) {
	for _, fact := range []struct {
		name  string
		check func(t *testing.T)
	}{
		{"a list is one unknown name", aListIsOneUnknownName},
		{"names are case- and space-sensitive", namesAreCaseAndSpaceSensitive},
		{"an unknown name is not named in the error", anUnknownNameIsNotNamed},
		{"OTEL_SDK_DISABLED is ignored", sdkDisabledIsIgnored},
		{"nothing set means otlp", nothingSetMeansOTLP},
		{"prometheus binds a port of its own", prometheusBindsAPortOfItsOwn},
	} {
		t.Run(fact.name, fact.check)
	}
}

// aListIsOneUnknownName checks that, with autoexport, a list is one unknown name.
func aListIsOneUnknownName(t *testing.T) {
	ctx := context.Background()
	// open-telemetry/opentelemetry-go-contrib#4471: OTEL_TRACES_EXPORTER
	// is looked up whole, and it reads os.Getenv itself, so a caller
	// cannot hand it one name of a list at a time either.
	clearEnv(t)
	t.Setenv("OTEL_TRACES_EXPORTER", "otlp,console")
	if exp, err := autoexport.NewSpanExporter(ctx); err == nil {
		_ = exp.Shutdown(ctx)
		t.Error("autoexport now accepts otlp,console: reconsider it")
	}
	p, err := tracing.Setup(ctx, tracing.WithExporters(tracingotlp.Exporter(), tracingconsole.Exporter()), tracing.WithConsoleWriter(io.Discard))
	if err != nil {
		t.Fatalf("tracing: %v", err)
	}
	_ = p.Shutdown(ctx)
}

// namesAreCaseAndSpaceSensitive checks that, with autoexport, names are case- and space-sensitive.
func namesAreCaseAndSpaceSensitive(t *testing.T) {
	ctx := context.Background()
	clearEnv(t)
	t.Setenv("OTEL_TRACES_EXPORTER", " OTLP")
	if exp, err := autoexport.NewSpanExporter(ctx); err == nil {
		_ = exp.Shutdown(ctx)
		t.Error(`autoexport now accepts " OTLP"`)
	}
}

// anUnknownNameIsNotNamed checks that, with autoexport, an unknown name is not named in the error.
func anUnknownNameIsNotNamed(t *testing.T) {
	ctx := context.Background()
	clearEnv(t)
	t.Setenv("OTEL_TRACES_EXPORTER", "zipkin")
	_, err := autoexport.NewSpanExporter(ctx)
	if err == nil || strings.Contains(err.Error(), "zipkin") {
		t.Errorf("autoexport's error is now %v", err)
	}
	_, err = tracing.Setup(ctx, tracing.WithExporters(tracingotlp.Exporter(), tracingconsole.Exporter()))
	if err == nil || !strings.Contains(err.Error(), `OTEL_TRACES_EXPORTER="zipkin"`) {
		t.Errorf("tracing: %v", err)
	}
}

// sdkDisabledIsIgnored checks that, with autoexport, OTEL_SDK_DISABLED is ignored.
func sdkDisabledIsIgnored(t *testing.T) {
	ctx := context.Background()
	clearEnv(t)
	t.Setenv("OTEL_SDK_DISABLED", "true")
	t.Setenv("OTEL_TRACES_EXPORTER", "otlp")
	exp, err := autoexport.NewSpanExporter(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = exp.Shutdown(ctx) }()
	if autoexport.IsNoneSpanExporter(exp) {
		t.Error("autoexport now honours OTEL_SDK_DISABLED")
	}
}

// nothingSetMeansOTLP checks that, with autoexport, nothing set means otlp.
func nothingSetMeansOTLP(t *testing.T) {
	ctx := context.Background()
	// Fixable with WithFallbackSpanExporter; listed because a daemon
	// must not dial a collector nobody configured.
	clearEnv(t)
	exp, err := autoexport.NewSpanExporter(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = exp.Shutdown(ctx) }()
	if autoexport.IsNoneSpanExporter(exp) {
		t.Error("autoexport's default is now none")
	}
}

// prometheusBindsAPortOfItsOwn checks that, with autoexport, prometheus binds a port of its own.
func prometheusBindsAPortOfItsOwn(t *testing.T) {
	ctx := context.Background()
	// Hold a port; autoexport's prometheus reader tries to bind it (and
	// would serve a second registry there), the metrics package does
	// not.
	clearEnv(t)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	addr := lis.Addr().(*net.TCPAddr)
	t.Setenv("OTEL_METRICS_EXPORTER", "prometheus")
	t.Setenv("OTEL_EXPORTER_PROMETHEUS_HOST", addr.IP.String())
	t.Setenv("OTEL_EXPORTER_PROMETHEUS_PORT", strings.TrimPrefix(lis.Addr().String(), addr.IP.String()+":"))
	r, err := autoexport.NewMetricReader(ctx)
	if err == nil || !strings.Contains(err.Error(), "binding address") {
		if r != nil {
			_ = r.Shutdown(ctx)
		}
		t.Errorf("autoexport's prometheus reader no longer binds its own port: %v", err)
	}
	p, err := metrics.Setup(ctx, metrics.WithExporters(metricsotlp.Exporter(), metricsconsole.Exporter(), metricsprom.Exporter()))
	if err != nil {
		t.Fatalf("metrics: %v", err)
	}
	_ = p.Shutdown(ctx)
}

func resourceFor(ctx context.Context) (*resource.Resource, error) {
	return resource.New(ctx, resource.WithTelemetrySDK(), resource.WithHost(),
		resource.WithAttributes(semconv.ServiceName("phasegate"), semconv.ServiceVersion("bench")),
		resource.WithFromEnv())
}

// autoexportTraces is tracing.Setup as it would be on autoexport: a
// fallback of no exporter, so that nothing set means no SDK.
func autoexportTraces(ctx context.Context) (func(context.Context) error, error) {
	exp, err := autoexport.NewSpanExporter(ctx, autoexport.WithFallbackSpanExporter(
		func(context.Context) (sdktrace.SpanExporter, error) { return nil, nil }))
	if err != nil {
		return nil, err
	}
	if exp == nil || autoexport.IsNoneSpanExporter(exp) {
		return func(context.Context) error { return nil }, nil
	}
	res, err := resourceFor(ctx)
	if err != nil {
		return nil, err
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return tp.Shutdown, nil
}

// autoexportMetrics is metrics.Setup as it would be on autoexport: the
// in-process registry /metrics serves, plus autoexport's reader.
func autoexportMetrics(ctx context.Context) (func(context.Context) error, error) {
	rd, err := autoexport.NewMetricReader(ctx, autoexport.WithFallbackMetricReader(
		func(context.Context) (sdkmetric.Reader, error) { return sdkmetric.NewManualReader(), nil }))
	if err != nil {
		return nil, err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	prom, err := otelprom.New(otelprom.WithRegisterer(reg),
		otelprom.WithTranslationStrategy(otlptranslator.UnderscoreEscapingWithSuffixes), otelprom.WithoutScopeInfo())
	if err != nil {
		return nil, err
	}
	res, err := resourceFor(ctx)
	if err != nil {
		return nil, err
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(prom), sdkmetric.WithReader(rd), sdkmetric.WithResource(res))
	return mp.Shutdown, nil
}

// BenchmarkSetup builds the same providers by hand (the tracing and
// metrics packages) and through autoexport, with no exporter and with
// OTLP/HTTP, in one run.
func BenchmarkSetup(b *testing.B) {
	col := httptest.NewServer(http.NotFoundHandler())
	defer col.Close()
	ctx := context.Background()
	setups := []struct {
		name  string
		setup func(context.Context) (func(context.Context) error, error)
	}{
		{"traces/handrolled", func(ctx context.Context) (func(context.Context) error, error) {
			p, err := tracing.Setup(ctx, tracing.WithExporters(tracingotlp.Exporter(), tracingconsole.Exporter()), tracing.WithVersion("bench"))
			if err != nil {
				return nil, err
			}
			return p.Shutdown, nil
		}},
		{"traces/autoexport", autoexportTraces},
		{"metrics/handrolled", func(ctx context.Context) (func(context.Context) error, error) {
			p, err := metrics.Setup(ctx, metrics.WithExporters(metricsotlp.Exporter(), metricsconsole.Exporter(), metricsprom.Exporter()), metrics.WithVersion("bench"))
			if err != nil {
				return nil, err
			}
			return p.Shutdown, nil
		}},
		{"metrics/autoexport", autoexportMetrics},
	}
	for _, exporter := range []string{"none", "otlp"} {
		for _, s := range setups {
			b.Run(exporter+"/"+s.name, func(b *testing.B) {
				clearEnv(b)
				b.Setenv("OTEL_TRACES_EXPORTER", exporter)
				b.Setenv("OTEL_METRICS_EXPORTER", exporter)
				b.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", col.URL)
				for b.Loop() {
					stop, err := s.setup(ctx)
					if err != nil {
						b.Fatal(err)
					}
					_ = stop(ctx) // metrics push once to a 404 on shutdown; the cost is what is measured
				}
			})
		}
	}
}
