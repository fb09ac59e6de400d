package server_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const probeInstall = "go install github.com/grpc-ecosystem/grpc-health-probe@v0.4.62"

// healthProbe finds the grpc-health-probe binary in PATH or in
// $(go env GOPATH)/bin. Without it the test is skipped, or fails when
// PHASEGATE_REQUIRE_TOOLS=1 (as in CI).
func healthProbe(t *testing.T) string {
	t.Helper()
	const name = "grpc-health-probe"
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	if out, err := exec.Command("go", "env", "GOPATH").Output(); err == nil {
		for _, dir := range filepath.SplitList(strings.TrimSpace(string(out))) {
			p := filepath.Join(dir, "bin", name)
			if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
				return p
			}
		}
	}
	if os.Getenv("PHASEGATE_REQUIRE_TOOLS") == "1" {
		t.Fatalf("%s not found in PATH or $(go env GOPATH)/bin; install it with: %s", name, probeInstall)
	}
	t.Skipf("%s not found in PATH or $(go env GOPATH)/bin; install it with: %s", name, probeInstall)
	return ""
}

// probe runs grpc-health-probe against addr and returns its exit code
// (0 SERVING, 4 NOT_SERVING) and output.
func probe(t *testing.T, bin, addr string, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"-addr=" + addr, "-connect-timeout=5s", "-rpc-timeout=5s"}, args...)...)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0, string(out)
	case errors.As(err, &exit):
		return exit.ExitCode(), string(out)
	}
	t.Fatalf("running %s: %v", bin, err)
	return -1, ""
}
