package otelsdk

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/sdk/resource"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
)

// Resource returns the resource for service name and version (version may
// be empty), with host.name, the telemetry SDK's attributes and, applied
// last so that they win, OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME.
// The SDK's WithResource would let a name given in code override the
// environment; building the resource this way round is what keeps the
// operator in charge.
func Resource(ctx context.Context, serviceName, version string) (*resource.Resource, error) {
	attrs := []resource.Option{resource.WithAttributes(semconv.ServiceName(serviceName))}
	if version != "" {
		attrs = append(attrs, resource.WithAttributes(semconv.ServiceVersion(version)))
	}
	opts := append([]resource.Option{resource.WithTelemetrySDK(), resource.WithHost()}, attrs...)
	r, err := resource.New(ctx, append(opts, resource.WithFromEnv())...)
	if err != nil {
		return nil, fmt.Errorf("resource: %w", err)
	}
	return r, nil
}
