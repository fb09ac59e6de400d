package app

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// A service that imports only app links no exporter and no integration it
// did not ask for: the exporters are packages of their own, given in
// Config. The go command lists what the package imports, transitively.
func TestAppLinksNoExporter(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/phasegate/phasegate/app").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 50 || !slices.Contains(deps, "github.com/looplab/fsm") {
		t.Fatalf("go list -deps listed %d packages, without looplab/fsm: not the app package's", len(deps))
	}
	for _, unwanted := range []string{
		"go.opentelemetry.io/otel/exporters/", // OTLP, stdout, Prometheus
		"go.opentelemetry.io/proto/otlp",
		"github.com/prometheus/",
		"github.com/grpc-ecosystem/grpc-gateway",
		"github.com/phasegate/phasegate/tracing/otlp",
		"github.com/phasegate/phasegate/tracing/console",
		"github.com/phasegate/phasegate/metrics/",
		"github.com/phasegate/phasegate/network",
	} {
		for _, d := range deps {
			if strings.HasPrefix(d, unwanted) {
				t.Errorf("app imports %s", d)
			}
		}
	}
}
