package tracing_test

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/tracing"
	tracingconsole "github.com/phasegate/phasegate/tracing/console"
	tracingotlp "github.com/phasegate/phasegate/tracing/otlp"
)

// Setup reads OTEL_TRACES_EXPORTER and friends; with nothing set, tracing is
// off and nothing is dialled. Hand the provider to the lifecycle and flush it
// on the way out.
func ExampleSetup() {
	os.Unsetenv("OTEL_SDK_DISABLED")
	os.Unsetenv("OTEL_TRACES_EXPORTER")
	ctx := context.Background()
	tp, err := tracing.Setup(ctx, tracing.WithExporters(tracingotlp.Exporter(), tracingconsole.Exporter()), tracing.WithVersion("v0.1.0"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer tp.Shutdown(ctx)

	lc, err := lifecycle.New([]lifecycle.Phase{
		{Name: "lock", Run: func(context.Context, *lifecycle.Progress) error { return nil }},
	}, lifecycle.WithTracerProvider(tp))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(tp.Exporter, lc.Start(ctx))
	// Output: none <nil>
}

// OTEL_TRACES_EXPORTER may name several exporters; each gets every span.
// Neither OTLP exporter dials before its first export, so Setup succeeds
// whether or not a collector listens at OTEL_EXPORTER_OTLP_ENDPOINT.
func ExampleSetup_exporterList() {
	os.Unsetenv("OTEL_SDK_DISABLED")
	os.Setenv("OTEL_TRACES_EXPORTER", "otlp,console")
	os.Setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc")
	defer os.Unsetenv("OTEL_TRACES_EXPORTER")
	defer os.Unsetenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")

	ctx := context.Background()
	tp, err := tracing.Setup(ctx, tracing.WithExporters(tracingotlp.Exporter(), tracingconsole.Exporter()), tracing.WithConsoleWriter(io.Discard))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer tp.Shutdown(ctx)
	fmt.Println(tp.Exporters, tp.Protocol)
	// Output: [otlp console] grpc
}

// OTEL_SDK_DISABLED=true turns tracing off whatever else is set.
func ExampleSetup_disabled() {
	os.Setenv("OTEL_SDK_DISABLED", "true")
	os.Setenv("OTEL_TRACES_EXPORTER", "otlp")
	defer os.Unsetenv("OTEL_SDK_DISABLED")
	defer os.Unsetenv("OTEL_TRACES_EXPORTER")

	tp, err := tracing.Setup(context.Background(), tracing.WithExporters(tracingotlp.Exporter(), tracingconsole.Exporter()))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(tp.Disabled, tp.Exporter)
	// Output: true none
}
