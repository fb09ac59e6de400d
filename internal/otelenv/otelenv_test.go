package otelenv_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/phasegate/phasegate/internal/otelenv"
)

func TestExporters(t *testing.T) {
	known := []string{"otlp", "console"}
	for _, tc := range []struct {
		value   string
		want    []string
		wantErr string
	}{
		{"", nil, ""},
		{"none", nil, ""},
		{" None ", nil, ""},
		{",", nil, ""},
		{"otlp", []string{"otlp"}, ""},
		{"Console, OTLP ,console", []string{"console", "otlp"}, ""},
		{"none,none", nil, ""},
		{"zipkin", nil, `X="zipkin": unknown exporter "zipkin": want a comma-separated list of otlp, console, or none`},
		{"otlp,none", nil, `X="otlp,none": "none" cannot be listed with other exporters`},
		{"otlp;console", nil, `unknown exporter "otlp;console"`},
	} {
		t.Run(tc.value, func(t *testing.T) {
			t.Setenv("X", tc.value)
			got, err := otelenv.Exporters("X", known...)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want it to contain %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || !slices.Equal(got, tc.want) {
				t.Fatalf("Exporters(%q) = %q, %v; want %q", tc.value, got, err, tc.want)
			}
		})
	}
}

func TestProtocol(t *testing.T) {
	for _, tc := range []struct {
		signal, general, want, wantErr string
	}{
		{"", "", "http/protobuf", ""},
		{"", "grpc", "grpc", ""},
		{"grpc", "http/protobuf", "grpc", ""},
		{"HTTP/Protobuf", "grpc", "http/protobuf", ""},
		{"", "http/json", "", `OTEL_EXPORTER_OTLP_PROTOCOL="http/json": unsupported OTLP protocol "http/json"`},
		// The signal's variable is read first, so its typo is what is named.
		{"grcp", "nonsense", "", `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="grcp"`},
	} {
		t.Run(tc.signal+"|"+tc.general, func(t *testing.T) {
			t.Setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", tc.signal)
			t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", tc.general)
			got, err := otelenv.Protocol("TRACES")
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want it to contain %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("Protocol = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func TestDisabled(t *testing.T) {
	for _, tc := range []struct {
		value string
		want  bool
		ok    bool
	}{
		{"", false, true}, {"false", false, true}, {"FALSE", false, true},
		{"true", true, true}, {" True ", true, true},
		{"1", false, false}, {"yes", false, false}, {"ture", false, false},
	} {
		t.Run(tc.value, func(t *testing.T) {
			t.Setenv("OTEL_SDK_DISABLED", tc.value)
			got, err := otelenv.Disabled()
			if (err == nil) != tc.ok || got != tc.want {
				t.Fatalf("Disabled() = %v, %v; want %v (error: %v)", got, err, tc.want, !tc.ok)
			}
		})
	}
}
