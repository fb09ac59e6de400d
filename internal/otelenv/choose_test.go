package otelenv_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/phasegate/phasegate/internal/otelenv"
)

func TestSignalChoose(t *testing.T) {
	s := otelenv.Signal{Name: "TRACES", Package: "tracing", Field: "TraceExporters"}
	for _, tc := range []struct {
		list, protocol string
		given          []string
		want           []string
		wantProtocol   string
		wantErr        string
	}{
		{list: "", given: nil},
		{list: "console,otlp", protocol: "grpc", given: []string{"otlp", "console"}, want: []string{"console", "otlp"}, wantProtocol: "grpc"},
		{list: "console", protocol: "bogus", given: []string{"console"}, want: []string{"console"}},
		{list: "mine", given: []string{"mine"}, want: []string{"mine"}},
		{list: "otlp", given: []string{"console"}, wantErr: "package github.com/phasegate/phasegate/tracing/otlp and give its Exporter in app.Config.TraceExporters"},
		{list: "otlp", protocol: "http/json", given: []string{"otlp"}, wantErr: "unsupported OTLP protocol"},
		{list: "zipkin", given: []string{"otlp"}, wantErr: "want a comma-separated list of otlp, console, otlp, or none"},
	} {
		t.Run(tc.list, func(t *testing.T) {
			t.Setenv("OTEL_TRACES_EXPORTER", tc.list)
			t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", tc.protocol)
			got, protocol, err := s.Choose([]string{"otlp", "console"}, tc.given)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want it to contain %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || !slices.Equal(got, tc.want) || protocol != tc.wantProtocol {
				t.Fatalf("Choose = %q, %q, %v; want %q, %q", got, protocol, err, tc.want, tc.wantProtocol)
			}
		})
	}
}

// stopped is a pipeline that counts its Shutdown.
type stopped struct{ n *int }

func (s stopped) Shutdown(context.Context) error { *s.n++; return nil }

func TestOpenStopsWhatItOpenedWhenOneFails(t *testing.T) {
	var stops int
	errNo := errors.New("no collector")
	_, err := otelenv.Open(context.Background(), []string{"a", "b", "c"}, func(name string) (stopped, error) {
		if name == "c" {
			return stopped{}, errNo
		}
		return stopped{&stops}, nil
	})
	if !errors.Is(err, errNo) || !strings.HasPrefix(err.Error(), "c exporter: ") || stops != 2 {
		t.Fatalf("Open = %v with %d stopped; want c's error and a and b stopped", err, stops)
	}
}
