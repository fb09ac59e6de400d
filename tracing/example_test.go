package tracing_test

import (
	"context"
	"fmt"
	"os"

	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/tracing"
)

// Setup reads OTEL_TRACES_EXPORTER and friends; with nothing set, tracing is
// off and nothing is dialled. Hand the provider to the lifecycle and flush it
// on the way out.
func ExampleSetup() {
	os.Unsetenv("OTEL_TRACES_EXPORTER")
	ctx := context.Background()
	tp, err := tracing.Setup(ctx, tracing.WithVersion("v0.1.0"))
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
