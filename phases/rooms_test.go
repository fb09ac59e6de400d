package phases

import (
	"go/build"
	"slices"
	"strings"
	"testing"
)

// The rooms keep to their jobs (docs/DESIGN.md §2): the lease core
// imports nothing of gRPC nor the Slots API's proto, and only the two
// adapters import gRPC's status and codes.
func TestRoomsImports(t *testing.T) {
	adapters := []string{"slotsapi", "cniapi"}
	for _, dir := range []string{".", "lease", "slotsapi", "cniapi", "internal/jsonroute", "internal/leasetest", "lockfile"} {
		p, err := build.ImportDir(dir, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range p.Imports {
			switch {
			case dir == "lease" && (strings.HasPrefix(imp, "google.golang.org/grpc") || strings.HasSuffix(imp, "/api/phasegate/v1")):
				t.Errorf("the lease core imports %s", imp)
			case (imp == "google.golang.org/grpc/status" || imp == "google.golang.org/grpc/codes") && !slices.Contains(adapters, dir):
				t.Errorf("phases/%s imports %s: only the adapters (%v) do", dir, imp, adapters)
			}
		}
	}
}
