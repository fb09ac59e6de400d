package tracing_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/phasegate/phasegate/tracing"
)

// clearEnv makes a test independent of the caller's OTEL_* variables.
func clearEnv(t *testing.T) {
	for _, k := range []string{
		"OTEL_TRACES_EXPORTER", "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES",
		"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
		"OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
		"OTEL_EXPORTER_OTLP_INSECURE", "OTEL_TRACES_SAMPLER",
	} {
		t.Setenv(k, "")
	}
}

func TestSetupNoneByDefault(t *testing.T) {
	clearEnv(t)
	p, err := tracing.Setup(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if p.Exporter != tracing.ExporterNone {
		t.Fatalf("exporter = %q, want none", p.Exporter)
	}
	_, span := p.Tracer("t").Start(context.Background(), "x")
	if span.SpanContext().IsValid() {
		t.Fatal("the none exporter recorded a span")
	}
	span.End()
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestSetupRejectsUnknownSettings(t *testing.T) {
	tests := []struct {
		name, exporter, protocol, want string
	}{
		{"unknown exporter", "zipkin", "", `OTEL_TRACES_EXPORTER="zipkin"`},
		{"two exporters", "otlp,console", "", "only one exporter"},
		{"unknown protocol", "otlp", "http/json", `protocol "http/json"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clearEnv(t)
			t.Setenv("OTEL_TRACES_EXPORTER", tc.exporter)
			t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", tc.protocol)
			_, err := tracing.Setup(context.Background())
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

// consoleServiceName sets up the console exporter, records one span and
// returns what the exporter wrote.
func consoleOutput(t *testing.T, opts ...tracing.Option) string {
	t.Helper()
	var buf bytes.Buffer
	p, err := tracing.Setup(context.Background(), append(opts, tracing.WithConsoleWriter(&buf))...)
	if err != nil {
		t.Fatal(err)
	}
	_, span := p.Tracer("t").Start(context.Background(), "phase lock")
	span.End()
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatalf("second Shutdown: %v", err)
	}
	return buf.String()
}

func TestServiceNameEnvironmentWins(t *testing.T) {
	tests := []struct {
		name, serviceEnv, attrsEnv string
		want                       string
	}{
		{"default", "", "", `"Value":"phasegate"`},
		{"OTEL_SERVICE_NAME", "node-agent", "", `"Value":"node-agent"`},
		{"OTEL_RESOURCE_ATTRIBUTES", "", "service.name=from-attrs", `"Value":"from-attrs"`},
		{"OTEL_SERVICE_NAME beats attributes", "node-agent", "service.name=from-attrs", `"Value":"node-agent"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clearEnv(t)
			t.Setenv("OTEL_TRACES_EXPORTER", "console")
			t.Setenv("OTEL_SERVICE_NAME", tc.serviceEnv)
			t.Setenv("OTEL_RESOURCE_ATTRIBUTES", tc.attrsEnv)
			out := consoleOutput(t, tracing.WithVersion("1.2.3"))
			if !strings.Contains(out, `"Name":"phase lock"`) {
				t.Fatalf("span missing from console output:\n%s", out)
			}
			i := strings.Index(out, `"Key":"service.name"`)
			if i < 0 || !strings.HasPrefix(out[i:], `"Key":"service.name","Value":{"Type":"STRING",`+tc.want) {
				t.Fatalf("service.name not %s in:\n%s", tc.want, out)
			}
			for _, key := range []string{`"Key":"service.version"`, `"Key":"host.name"`} {
				if !strings.Contains(out, key) {
					t.Errorf("resource lacks %s", key)
				}
			}
		})
	}
}

// exportedSpans decodes what an OTLP receiver got into span names and the
// service name of their resource.
func exportedSpans(reqs []*collectortrace.ExportTraceServiceRequest) (names []string, service string) {
	for _, req := range reqs {
		for _, rs := range req.ResourceSpans {
			for _, a := range rs.Resource.Attributes {
				if a.Key == "service.name" {
					service = a.Value.GetStringValue()
				}
			}
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					names = append(names, s.Name)
				}
			}
		}
	}
	return names, service
}

func TestOTLPHTTPExportsToCollector(t *testing.T) {
	clearEnv(t)
	var mu sync.Mutex
	var got []*collectortrace.ExportTraceServiceRequest
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		req := &collectortrace.ExportTraceServiceRequest{}
		if r.URL.Path != "/v1/traces" || proto.Unmarshal(body, req) != nil {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		mu.Lock()
		got = append(got, req)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
		_, _ = w.Write(out)
	}))
	defer srv.Close()

	t.Setenv("OTEL_TRACES_EXPORTER", "otlp")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL)
	t.Setenv("OTEL_SERVICE_NAME", "otlp-http-test")
	exportOne(t, "http/protobuf")

	mu.Lock()
	defer mu.Unlock()
	names, service := exportedSpans(got)
	if len(names) != 1 || names[0] != "startup" || service != "otlp-http-test" {
		t.Fatalf("collector got spans %v from service %q", names, service)
	}
}

type traceCollector struct {
	collectortrace.UnimplementedTraceServiceServer
	mu  sync.Mutex
	got []*collectortrace.ExportTraceServiceRequest
}

func (c *traceCollector) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.got = append(c.got, req)
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

func TestOTLPGRPCExportsToCollector(t *testing.T) {
	clearEnv(t)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	col := &traceCollector{}
	gs := grpc.NewServer()
	collectortrace.RegisterTraceServiceServer(gs, col)
	go func() { _ = gs.Serve(lis) }()
	defer gs.Stop()

	t.Setenv("OTEL_TRACES_EXPORTER", "otlp")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+lis.Addr().String())
	t.Setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
	exportOne(t, "grpc")

	col.mu.Lock()
	defer col.mu.Unlock()
	names, service := exportedSpans(col.got)
	if len(names) != 1 || names[0] != "startup" || service != "phasegate" {
		t.Fatalf("collector got spans %v from service %q", names, service)
	}
}

func exportOne(t *testing.T, protocol string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := tracing.Setup(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if p.Exporter != tracing.ExporterOTLP || p.Protocol != protocol {
		t.Fatalf("exporter %q protocol %q, want otlp %q", p.Exporter, p.Protocol, protocol)
	}
	_, span := p.Tracer("t").Start(ctx, "startup")
	span.End()
	if err := p.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown (flush): %v", err)
	}
}
