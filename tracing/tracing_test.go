package tracing_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/phasegate/phasegate/tracing"
	tracingconsole "github.com/phasegate/phasegate/tracing/console"
	tracingotlp "github.com/phasegate/phasegate/tracing/otlp"
)

// clearEnv makes a test independent of the caller's OTEL_* variables.
func clearEnv(t *testing.T) {
	for _, k := range []string{
		"OTEL_TRACES_EXPORTER", "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES",
		"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
		"OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
		"OTEL_EXPORTER_OTLP_INSECURE", "OTEL_TRACES_SAMPLER", "OTEL_SDK_DISABLED",
	} {
		t.Setenv(k, "")
	}
}

func TestSetupNoneByDefault(t *testing.T) {
	clearEnv(t)
	p, err := tracing.Setup(context.Background(), tracing.WithExporters(tracingotlp.Exporter(), tracingconsole.Exporter()))
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

// A value Setup does not know is an error naming it, never a quiet
// fallback that would drop spans.
func TestSetupRejectsUnknownSettings(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		want string
	}{
		{"unknown exporter", map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, `OTEL_TRACES_EXPORTER="zipkin"`},
		{"unknown exporter in a list", map[string]string{"OTEL_TRACES_EXPORTER": "otlp,jaeger"}, `unknown exporter "jaeger"`},
		{"prometheus is no trace exporter", map[string]string{"OTEL_TRACES_EXPORTER": "prometheus"}, `unknown exporter "prometheus"`},
		{"none beside an exporter", map[string]string{"OTEL_TRACES_EXPORTER": "none,console"}, `"none" cannot be listed`},
		{"unknown protocol", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"},
			`OTEL_EXPORTER_OTLP_PROTOCOL="http/json": unsupported OTLP protocol "http/json"`},
		{"unknown traces protocol", map[string]string{"OTEL_TRACES_EXPORTER": "console,otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
			"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grcp"}, `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="grcp"`},
		{"SDK_DISABLED not a boolean", map[string]string{"OTEL_SDK_DISABLED": "yes", "OTEL_TRACES_EXPORTER": "otlp"}, `OTEL_SDK_DISABLED="yes"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clearEnv(t)
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			p, err := tracing.Setup(context.Background(), tracing.WithExporters(tracingotlp.Exporter(), tracingconsole.Exporter()))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				_ = p.Shutdown(context.Background())
				t.Fatalf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

// consoleOutput sets up the console exporter, records one span and
// returns what the exporter wrote.
func consoleOutput(t *testing.T, opts ...tracing.Option) string {
	t.Helper()
	var buf bytes.Buffer
	p, err := tracing.Setup(context.Background(), append(opts, tracing.WithExporters(tracingotlp.Exporter(), tracingconsole.Exporter()), tracing.WithConsoleWriter(&buf))...)
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

// httpCollector is an OTLP/HTTP trace receiver on loopback.
type httpCollector struct {
	URL string
	mu  sync.Mutex
	got []*collectortrace.ExportTraceServiceRequest
}

func newHTTPCollector(t *testing.T) *httpCollector {
	t.Helper()
	c := &httpCollector{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		req := &collectortrace.ExportTraceServiceRequest{}
		if r.URL.Path != "/v1/traces" || proto.Unmarshal(body, req) != nil {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		c.mu.Lock()
		c.got = append(c.got, req)
		c.mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
		_, _ = w.Write(out)
	}))
	t.Cleanup(srv.Close)
	c.URL = srv.URL
	return c
}

func (c *httpCollector) spans() (names []string, service string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return exportedSpans(c.got)
}

func TestOTLPHTTPExportsToCollector(t *testing.T) {
	clearEnv(t)
	col := newHTTPCollector(t)
	t.Setenv("OTEL_TRACES_EXPORTER", "otlp")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", col.URL)
	t.Setenv("OTEL_SERVICE_NAME", "otlp-http-test")
	exportOne(t, "http/protobuf")

	names, service := col.spans()
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

// The signal's own protocol variable beats the general one, and protocol
// names are case-insensitive.
func TestOTLPGRPCExportsToCollector(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
	}{
		{"OTEL_EXPORTER_OTLP_PROTOCOL", map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}},
		{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL wins", map[string]string{
			"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": " GRPC"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
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
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+lis.Addr().String())
			t.Setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
			exportOne(t, "grpc")

			col.mu.Lock()
			defer col.mu.Unlock()
			names, service := exportedSpans(col.got)
			if len(names) != 1 || names[0] != "startup" || service != "phasegate" {
				t.Fatalf("collector got spans %v from service %q", names, service)
			}
		})
	}
}

func exportOne(t *testing.T, protocol string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := tracing.Setup(ctx, tracing.WithExporters(tracingotlp.Exporter(), tracingconsole.Exporter()))
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

// OTEL_TRACES_EXPORTER is a list: every span goes to each exporter named,
// once, whatever the case, spacing or repeats.
func TestSetupExporterList(t *testing.T) {
	clearEnv(t)
	col := newHTTPCollector(t)
	t.Setenv("OTEL_TRACES_EXPORTER", " OTLP, console,,otlp ")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", col.URL)
	var console bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := tracing.Setup(ctx, tracing.WithExporters(tracingotlp.Exporter(), tracingconsole.Exporter()), tracing.WithConsoleWriter(&console))
	if err != nil {
		t.Fatal(err)
	}
	if p.Exporter != "otlp,console" || !slices.Equal(p.Exporters, []string{"otlp", "console"}) || p.Protocol != "http/protobuf" {
		t.Fatalf("Exporter %q Exporters %q Protocol %q, want otlp,console over http/protobuf", p.Exporter, p.Exporters, p.Protocol)
	}
	_, span := p.Tracer("t").Start(ctx, "populate")
	span.End()
	if err := p.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if names, _ := col.spans(); !slices.Equal(names, []string{"populate"}) {
		t.Errorf("OTLP collector got %q, want [populate]", names)
	}
	if n := strings.Count(console.String(), `"Name":"populate"`); n != 1 {
		t.Errorf("console has the span %d times, want once:\n%s", n, console.String())
	}
}

// OTEL_SDK_DISABLED=true wins over every other setting: no span is
// recorded or sent, and no other variable is read (a bad exporter name
// is not an error then).
func TestSetupSDKDisabled(t *testing.T) {
	for _, tc := range []struct{ disabled, exporter string }{
		{"true", "otlp,console"},
		{" TRUE ", "otlp"},
		{"True", "zipkin"},
	} {
		t.Run(tc.disabled+"/"+tc.exporter, func(t *testing.T) {
			clearEnv(t)
			col := newHTTPCollector(t)
			t.Setenv("OTEL_SDK_DISABLED", tc.disabled)
			t.Setenv("OTEL_TRACES_EXPORTER", tc.exporter)
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", col.URL)
			var console bytes.Buffer
			p, err := tracing.Setup(context.Background(), tracing.WithExporters(tracingotlp.Exporter(), tracingconsole.Exporter()), tracing.WithConsoleWriter(&console))
			if err != nil {
				t.Fatal(err)
			}
			if !p.Disabled || p.Exporter != tracing.ExporterNone || len(p.Exporters) != 0 {
				t.Fatalf("Disabled %v Exporter %q Exporters %q, want disabled and none", p.Disabled, p.Exporter, p.Exporters)
			}
			_, span := p.Tracer("t").Start(context.Background(), "lock")
			if span.SpanContext().IsValid() || span.IsRecording() {
				t.Error("a disabled provider recorded a span")
			}
			span.End()
			// Shutdown flushes every exporter there is; with none, the
			// collector and the console stay empty.
			if err := p.Shutdown(context.Background()); err != nil {
				t.Fatal(err)
			}
			if names, _ := col.spans(); len(names) != 0 || console.Len() != 0 {
				t.Errorf("disabled, yet the collector got %q and the console %q", names, console.String())
			}
		})
	}
	t.Run("false keeps the SDK on", func(t *testing.T) {
		clearEnv(t)
		t.Setenv("OTEL_SDK_DISABLED", "false")
		t.Setenv("OTEL_TRACES_EXPORTER", "console")
		if out := consoleOutput(t); !strings.Contains(out, `"Name":"phase lock"`) {
			t.Errorf("no span on the console with OTEL_SDK_DISABLED=false:\n%s", out)
		}
	})
}

// An exporter the environment asks for but the binary was not given is an
// error naming the package that provides it; with none asked for, Setup
// needs none.
func TestSetupNamesMissingExporter(t *testing.T) {
	for _, tc := range []struct {
		env, pkg string // pkg empty: no error
		given    []tracing.Exporter
	}{
		{env: "", pkg: ""},
		{env: "none", pkg: ""},
		{env: "otlp", pkg: "phasegate/tracing/otlp"},
		{env: "console", pkg: "phasegate/tracing/console"},
		{env: "otlp,console", pkg: "phasegate/tracing/console", given: []tracing.Exporter{tracingotlp.Exporter()}},
		{env: "console", pkg: "", given: []tracing.Exporter{tracingconsole.Exporter()}},
	} {
		t.Run(tc.env, func(t *testing.T) {
			clearEnv(t)
			t.Setenv("OTEL_TRACES_EXPORTER", tc.env)
			p, err := tracing.Setup(context.Background(), tracing.WithExporters(tc.given...), tracing.WithConsoleWriter(io.Discard))
			if tc.pkg == "" {
				if err != nil {
					t.Fatal(err)
				}
				_ = p.Shutdown(context.Background())
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.pkg) || !strings.Contains(err.Error(), "OTEL_TRACES_EXPORTER") {
				t.Fatalf("Setup: %v, want an error naming OTEL_TRACES_EXPORTER and %s", err, tc.pkg)
			}
		})
	}
}
