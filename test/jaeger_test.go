package test

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/phasegate/phasegate/network/nft"
	"github.com/phasegate/phasegate/phasetest/proc"
)

func tableOf(prefix string) string { return nft.TableName(prefix) }

// jaeger is a Jaeger v2 all-in-one process on loopback.
type jaeger struct {
	otlpHTTP string // host:port of the OTLP/HTTP receiver
	query    string // host:port of the query API
}

// startJaeger runs the Jaeger binary that `make test` builds and caches
// (PHASEGATE_JAEGER), building it on first use if needed.
func startJaeger(t *testing.T) *jaeger {
	t.Helper()
	bin := os.Getenv("PHASEGATE_JAEGER")
	if bin == "" {
		out, err := exec.Command("../tools/jaeger/build.sh").Output()
		if err != nil {
			if os.Getenv("PHASEGATE_REQUIRE_TOOLS") == "1" {
				t.Fatalf("building jaeger: %v", err)
			}
			t.Skipf("jaeger not available (tools/jaeger/build.sh: %v)", err)
		}
		bin = strings.TrimSpace(string(out))
	}
	// Hold every listener until all ports are picked, so none repeats.
	ports := map[string]string{}
	var held []net.Listener
	for _, k := range []string{"JAEGER_HEALTH_PORT", "JAEGER_QUERY_PORT", "JAEGER_QUERY_GRPC_PORT", "JAEGER_OTLP_GRPC_PORT", "JAEGER_OTLP_HTTP_PORT"} {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, l)
		ports[k] = strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	}
	for _, l := range held {
		l.Close()
	}
	var env []string
	for k, v := range ports {
		env = append(env, k+"="+v)
	}
	p := proc.Start(t, bin, proc.Args("--config", "file:testdata/jaeger.yaml"), proc.Env(env...), proc.NoAddrFile())
	j := &jaeger{otlpHTTP: "127.0.0.1:" + ports["JAEGER_OTLP_HTTP_PORT"], query: "127.0.0.1:" + ports["JAEGER_QUERY_PORT"]}
	health := "http://127.0.0.1:" + ports["JAEGER_HEALTH_PORT"] + "/status"
	waitFor(t, 60*time.Second, "jaeger to be ready", func() bool {
		if !p.Running() {
			t.Fatalf("jaeger exited: %v", p.Err())
		}
		resp, err := http.Get(health)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return j
}

// otlpSpan is the part of an OTLP/JSON span the checks read.
type otlpSpan struct {
	TraceID      string `json:"traceId"`
	SpanID       string `json:"spanId"`
	ParentSpanID string `json:"parentSpanId"`
	Name         string `json:"name"`
	Start        string `json:"startTimeUnixNano"`
	End          string `json:"endTimeUnixNano"`
	Attributes   []struct {
		Key   string `json:"key"`
		Value struct {
			String *string `json:"stringValue"`
			Bool   *bool   `json:"boolValue"`
		} `json:"value"`
	} `json:"attributes"`
}

// attr returns the span's attribute key as a string ("true" or "false"
// for a bool), and whether it has it.
func (s otlpSpan) attr(key string) (string, bool) {
	for _, a := range s.Attributes {
		switch {
		case a.Key != key:
		case a.Value.String != nil:
			return *a.Value.String, true
		case a.Value.Bool != nil:
			return strconv.FormatBool(*a.Value.Bool), true
		}
	}
	return "", false
}

func (s otlpSpan) times() (start, end int64) {
	start, _ = strconv.ParseInt(s.Start, 10, 64)
	end, _ = strconv.ParseInt(s.End, 10, 64)
	return start, end
}

// spans asks Jaeger's /api/v3/traces for service's spans since since.
func (j *jaeger) spans(service string, since time.Time) ([]otlpSpan, error) {
	q := url.Values{
		"query.service_name":   {service},
		"query.start_time_min": {since.Add(-time.Minute).UTC().Format(time.RFC3339Nano)},
		"query.start_time_max": {time.Now().Add(time.Minute).UTC().Format(time.RFC3339Nano)},
		"query.num_traces":     {"100"},
	}
	resp, err := http.Get("http://" + j.query + "/api/v3/traces?" + q.Encode())
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var body struct {
		Result struct {
			ResourceSpans []struct {
				ScopeSpans []struct {
					Spans []otlpSpan `json:"spans"`
				} `json:"scopeSpans"`
			} `json:"resourceSpans"`
		} `json:"result"`
		Error *struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return nil, fmt.Errorf("decode /api/v3/traces: %w", err)
	}
	if body.Error != nil {
		return nil, fmt.Errorf("/api/v3/traces: %s", body.Error.Message)
	}
	var out []otlpSpan
	for _, rs := range body.Result.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			out = append(out, ss.Spans...)
		}
	}
	return out, nil
}

// checkTrace reads the start's trace back from Jaeger: one root "startup",
// one child per phase, each starting after all its dependencies ended.
func checkTrace(t *testing.T, j *jaeger, service string, since time.Time) {
	t.Helper()
	var spans []otlpSpan
	waitFor(t, 30*time.Second, "the startup trace in jaeger", func() bool {
		var err error
		spans, err = j.spans(service, since)
		if err != nil {
			t.Logf("jaeger: %v", err)
			return false
		}
		n := 0
		for _, s := range spans {
			if strings.HasPrefix(s.Name, "phase ") {
				n++
			}
		}
		return n >= len(phaseDeps)
	})
	var roots []otlpSpan
	for _, s := range spans {
		if s.Name == "startup" {
			roots = append(roots, s)
		}
	}
	if len(roots) != 1 {
		t.Fatalf("%d startup spans, want 1", len(roots))
	}
	root := roots[0]
	if root.ParentSpanID != "" {
		t.Errorf("startup has a parent %q", root.ParentSpanID)
	}
	phases := map[string]otlpSpan{}
	for _, s := range spans {
		name, ok := strings.CutPrefix(s.Name, "phase ")
		if !ok {
			continue
		}
		if _, dup := phases[name]; dup {
			t.Errorf("two spans for phase %s", name)
		}
		phases[name] = s
		if s.TraceID != root.TraceID || s.ParentSpanID != root.SpanID {
			t.Errorf("phase %s is not a child of startup", name)
		}
	}
	for name, deps := range phaseDeps {
		s, ok := phases[name]
		if !ok {
			t.Errorf("no span for phase %s", name)
			continue
		}
		start, _ := s.times()
		for _, dep := range deps {
			_, depEnd := phases[dep].times()
			if start < depEnd {
				t.Errorf("phase %s started %dns before its dependency %s ended", name, depEnd-start, dep)
			}
		}
	}
}
