package otelsdk_test

import (
	"context"
	"testing"

	"github.com/phasegate/phasegate/internal/otelsdk"
)

// The environment wins over the name and version given in code.
func TestResource(t *testing.T) {
	for _, tc := range []struct {
		name, serviceEnv, attrsEnv, want, wantVersion string
	}{
		{"code", "", "", "phasegate", "1.0"},
		{"OTEL_SERVICE_NAME", "node-agent", "", "node-agent", "1.0"},
		{"OTEL_RESOURCE_ATTRIBUTES", "", "service.name=ci,service.version=2.0", "ci", "2.0"},
		{"both", "node-agent", "service.name=ci", "node-agent", "1.0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("OTEL_SERVICE_NAME", tc.serviceEnv)
			t.Setenv("OTEL_RESOURCE_ATTRIBUTES", tc.attrsEnv)
			r, err := otelsdk.Resource(context.Background(), "phasegate", "1.0")
			if err != nil {
				t.Fatal(err)
			}
			attrs := map[string]string{}
			for _, kv := range r.Attributes() {
				attrs[string(kv.Key)] = kv.Value.Emit()
			}
			if attrs["service.name"] != tc.want || attrs["service.version"] != tc.wantVersion || attrs["host.name"] == "" {
				t.Errorf("service.name %q service.version %q host.name %q; want %q %q and a host",
					attrs["service.name"], attrs["service.version"], attrs["host.name"], tc.want, tc.wantVersion)
			}
		})
	}
}
