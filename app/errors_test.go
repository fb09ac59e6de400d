package app

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/server"
)

// A phase that clashes with the App's own is refused with an error that
// says so, not as a duplicate name or a cycle.
func TestNewNamesTheClashWithTheAppsPhases(t *testing.T) {
	tests := []struct {
		name    string
		phases  []lifecycle.Phase
		want    any // a pointer to the error type expected
		says    string
		notSays string
	}{
		{"a phase named listen", []lifecycle.Phase{{Name: PhaseListen, Run: nop}},
			new(*ReservedPhaseError), `phase "listen": the name is reserved by the App`, "more than once"},
		{"a phase named serve", []lifecycle.Phase{{Name: PhaseServe, Run: nop}},
			new(*ReservedPhaseError), `phase "serve": the name is reserved by the App`, "more than once"},
		{"a dependency on serve", []lifecycle.Phase{{Name: "x", DependsOn: []string{PhaseServe}, Run: nop}},
			new(*ServeDependencyError), `phase "x" depends on "serve": nothing may depend on serve`, "cycle"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, err := New(testConfig(), tt.phases...)
			if err == nil {
				_ = a.Stop(context.Background())
				t.Fatal("New succeeded")
			}
			if !errors.Is(err, ErrConfig) || !errors.As(err, tt.want) {
				t.Fatalf("New = %v, want ErrConfig and a %T", err, tt.want)
			}
			if !strings.Contains(err.Error(), tt.says) || strings.Contains(err.Error(), tt.notSays) {
				t.Fatalf("New = %q, want it to say %q and not %q", err, tt.says, tt.notSays)
			}
		})
	}
}

// The routes the App serves itself are refused to a service, naming them;
// a debug page of the service's own stays allowed.
func TestTheAppsRoutesAreRefused(t *testing.T) {
	a, err := New(testConfig(), lifecycle.Phase{Name: "register", DependsOn: []string{PhaseListen}, Run: nop})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = a.Stop(context.Background()) }()
	for _, pattern := range []string{
		"GET /health", "GET /readyz", "GET /livez", "GET /startupz",
		"GET " + PathMetrics, "GET " + PathLifecycle, "GET " + PathEvents, "GET " + PathStartup,
	} {
		path := strings.TrimPrefix(pattern, "GET ")
		for name, err := range map[string]error{
			"DeclareHTTP": a.Server().DeclareHTTP(pattern),
			"Handle":      a.Server().Handle(pattern, http.NotFoundHandler()),
		} {
			var re *server.ReservedPathError
			if !errors.As(err, &re) || !strings.Contains(err.Error(), path) {
				t.Errorf("%s(%q) = %v, want a *server.ReservedPathError naming %s", name, pattern, err, path)
			}
		}
	}
	if err := a.Server().DeclareHTTP("GET /debug/mine"); err != nil {
		t.Errorf("DeclareHTTP of a debug page of the service's own: %v", err)
	}
}

// An exporter the environment asks for that the App was not given fails
// New naming what an App user does: the package to link and the Config
// field to give its Exporter in (not a Setup an App user never calls).
func TestNewNamesTheExporterFieldToFill(t *testing.T) {
	for _, tc := range []struct{ env, field, pkg string }{
		{"OTEL_TRACES_EXPORTER", "app.Config.TraceExporters", "phasegate/tracing/otlp"},
		{"OTEL_METRICS_EXPORTER", "app.Config.MetricExporters", "phasegate/metrics/otlp"},
	} {
		t.Run(tc.env, func(t *testing.T) {
			t.Setenv(tc.env, "otlp")
			cfg := DefaultConfig("catalog", "127.0.0.1:0")
			a, err := New(cfg, lifecycle.Phase{Name: "config", Run: func(context.Context, *lifecycle.Progress) error { return nil }})
			if err == nil {
				_ = a.Stop(context.Background())
				t.Fatalf("New with %s=otlp and no exporter given: no error", tc.env)
			}
			if !strings.Contains(err.Error(), tc.field) || !strings.Contains(err.Error(), tc.pkg) {
				t.Errorf("New with %s=otlp: %v; want it to name %s and %s", tc.env, err, tc.pkg, tc.field)
			}
		})
	}
}

// The exit code is a supervisor's contract: a phase's configuration
// error exits 2 and is not retried; any other failure exits 1; New's
// errors are configuration errors.
func TestExitCodeTellsConfigurationFromFailure(t *testing.T) {
	errUnreachable := errors.New("registry unreachable")
	for _, tc := range []struct {
		name     string
		err      error
		code     int
		attempts int
	}{
		{"configuration error", BadConfig(errors.New(`-cache-entries "x": want a positive number`)), ExitConfig, 1},
		{"dependency unreachable", errUnreachable, ExitFailure, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			attempts := 0
			cfg := DefaultConfig("runner", "127.0.0.1:0")
			a, err := New(cfg, lifecycle.Phase{Name: "config", Retry: lifecycle.RetryPolicy{Attempts: 3},
				Run: func(context.Context, *lifecycle.Progress) error { attempts++; return tc.err }})
			if err != nil {
				t.Fatal(err)
			}
			err = a.Run(context.Background())
			if got := ExitCode(err); got != tc.code || attempts != tc.attempts {
				t.Errorf("Run: %v: exit code %d after %d attempts, want %d after %d", err, got, attempts, tc.code, tc.attempts)
			}
			if err == nil || !strings.Contains(err.Error(), tc.err.Error()) {
				t.Errorf("Run's error %v does not say the phase's %v", err, tc.err)
			}
		})
	}
	_, err := New(DefaultConfig("runner", ""))
	if got := ExitCode(err); got != ExitConfig {
		t.Errorf("New without an address: %v, exit code %d, want %d", err, got, ExitConfig)
	}
	policy := &lifecycle.PolicyError{Phase: "registry", Err: errors.New("negative Timeout")}
	if got := ExitCode(fmt.Errorf("start: %w", policy)); got != ExitConfig {
		t.Errorf("a phase's refused policy: exit code %d, want %d", got, ExitConfig)
	}
	if got := ExitCode(nil); got != ExitOK {
		t.Errorf("ExitCode(nil) = %d", got)
	}
	if BadConfig(nil) != nil {
		t.Error("BadConfig(nil) is not nil")
	}
}
