package metrics

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// Attribute keys of the health check counter.
const (
	KeyDialect = attribute.Key("dialect")
	KeyResult  = attribute.Key("result")
)

// Health check dialects and results, the values of the "dialect" and
// "result" attributes of phasegate.health.checks.
const (
	DialectGRPC      = "grpc"       // grpc.health.v1 Check
	DialectGRPCWatch = "grpc_watch" // each status sent on a grpc.health.v1 Watch stream
	// The HTTP dialects are the endpoints' names: "health" (Nomad and
	// Consul, application/health+json), "livez", "readyz", "startupz".

	ResultPass  = "pass"  // SERVING, 2xx
	ResultFail  = "fail"  // NOT_SERVING, 503
	ResultError = "error" // anything else: an RPC error, 404, 405
)

const (
	healthCheckMethod = "/grpc.health.v1.Health/Check"
	healthWatchMethod = "/grpc.health.v1.Health/Watch"
)

// HealthChecks counts the health checks a daemon answers, in the counter
// phasegate.health.checks by dialect and result. Feed it HTTP answers with
// [HealthChecks.HTTP] (health.Options.OnHTTPCheck) and gRPC ones with its
// interceptors.
type HealthChecks struct {
	counter metric.Int64Counter
	// attrs holds the attributes of every known dialect and result, built
	// once and read without a lock: building and hashing a set on each of
	// thousands of answers a second is a cost the daemon pays on the path
	// that must stay fast while it reclaims.
	attrs map[dialectResult]metric.AddOption
}

type dialectResult struct{ dialect, result string }

// NewHealthChecks registers the counter on mp.
func NewHealthChecks(mp metric.MeterProvider) (*HealthChecks, error) {
	c, err := mp.Meter(scope).Int64Counter("phasegate.health.checks",
		metric.WithDescription("Health checks answered, by dialect (grpc, grpc_watch, health, livez, readyz, startupz) and result (pass, fail, error)."))
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	h := &HealthChecks{counter: c, attrs: make(map[dialectResult]metric.AddOption)}
	for _, d := range []string{DialectGRPC, DialectGRPCWatch, "health", "livez", "readyz", "startupz"} {
		for _, r := range []string{ResultPass, ResultFail, ResultError} {
			h.attrs[dialectResult{d, r}] = attrOption(d, r)
		}
	}
	return h, nil
}

func attrOption(dialect, result string) metric.AddOption {
	return metric.WithAttributeSet(attribute.NewSet(KeyDialect.String(dialect), KeyResult.String(result)))
}

func (h *HealthChecks) add(dialect, result string) {
	opt, ok := h.attrs[dialectResult{dialect, result}]
	if !ok {
		opt = attrOption(dialect, result)
	}
	h.counter.Add(context.Background(), 1, opt)
}

// HTTP counts an answer of an HTTP health endpoint: path is its path
// ("/health", "/readyz"), code the status sent.
func (h *HealthChecks) HTTP(path string, code int) {
	result := ResultError
	switch {
	case code >= 200 && code < 300:
		result = ResultPass
	case code == http.StatusServiceUnavailable:
		result = ResultFail
	}
	h.add(strings.TrimPrefix(path, "/"), result)
}

func statusResult(s healthpb.HealthCheckResponse_ServingStatus) string {
	if s == healthpb.HealthCheckResponse_SERVING {
		return ResultPass
	}
	return ResultFail
}

// UnaryServerInterceptor counts grpc.health.v1 Check calls and passes
// every call on.
func (h *HealthChecks) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		resp, err := handler(ctx, req)
		if info.FullMethod == healthCheckMethod {
			result := ResultError
			if r, ok := resp.(*healthpb.HealthCheckResponse); ok && err == nil {
				result = statusResult(r.GetStatus())
			}
			h.add(DialectGRPC, result)
		}
		return resp, err
	}
}

// StreamServerInterceptor counts every status sent on grpc.health.v1
// Watch streams and passes every stream on.
func (h *HealthChecks) StreamServerInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if info.FullMethod != healthWatchMethod {
			return handler(srv, ss)
		}
		return handler(srv, &watchCounter{ServerStream: ss, h: h})
	}
}

type watchCounter struct {
	grpc.ServerStream
	h *HealthChecks
}

func (w *watchCounter) SendMsg(m any) error {
	err := w.ServerStream.SendMsg(m)
	if r, ok := m.(*healthpb.HealthCheckResponse); ok && err == nil {
		w.h.add(DialectGRPCWatch, statusResult(r.GetStatus()))
	}
	return err
}
