package test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The adopters' status tool as shipped: cmd/phasegate-status built as `go
// build` makes it, which links no gRPC, asked about the daemon's port.
// status --watch follows the start to serving and exits 0; status prints
// the phases; probe exits 0; events --until-over prints the lifecycle's
// events up to serving. Against a port nothing listens on, each exits 2.
func TestStatusToolAsksTheDaemon(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "phasegate-status")
	if out, err := exec.Command("go", "build", "-trimpath", "-o", bin, "github.com/phasegate/phasegate/cmd/phasegate-status").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	st, err := os.Stat(bin)
	if err != nil {
		t.Fatal(err)
	}
	// A grpc-go client alone would add ~9 MB (docs/BENCHMARKS.md, "The
	// CNI plugin's exec cost").
	if st.Size() > 12<<20 {
		t.Errorf("phasegate-status is %.1f MB: it links more than the framework's views", float64(st.Size())/1e6)
	}
	t.Logf("phasegate-status: %.1f MB", float64(st.Size())/1e6)
	tool := func(args ...string) (string, int) {
		t.Helper()
		out, err := exec.Command(bin, args...).CombinedOutput()
		code := exitCode(err)
		if code < 0 {
			t.Fatalf("phasegate-status %v: %v", args, err)
		}
		return string(out), code
	}

	h := newHost(t)
	addr := freePort(t)
	if out, code := tool("probe", "--addr", addr); code != 2 {
		t.Errorf("probe of a closed port: exit %d, want 2\n%s", code, out)
	}
	d := start(t, nil, h.args(addr)...)
	if out, code := tool("status", "--watch", "--addr", addr); code != 0 || !strings.Contains(out, "serving") {
		t.Errorf("status --watch: exit %d, want 0 once serving\n%s", code, out)
	}
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"status", "--addr", addr}, []string{"lifecycle serving", "reclaim", "populate", "succeeded"}},
		{[]string{"probe", "--addr", addr}, []string{"ok"}},
		{[]string{"events", "--until-over", "--addr", addr}, []string{"phase lock", "serving"}},
	} {
		if out, code := tool(tc.args...); code != 0 || !containsAll(out, tc.want) {
			t.Errorf("phasegate-status %v: exit %d, want 0 and %q\n%s", tc.args, code, tc.want, out)
		}
	}
	// The daemon's own CLI runs the same code, as the README shows it.
	if out, err := exec.Command(binary, "events", "--until-over", "--addr", addr).CombinedOutput(); err != nil || !containsAll(string(out), []string{"phase lock", "serving"}) {
		t.Errorf("phasegate events --until-over: %v\n%s", err, out)
	}
	d.signal(syscall.SIGTERM)
	if code := d.wait(time.Minute); code != 0 {
		t.Fatalf("stop: exit %d", code)
	}
	if out, code := tool("status", "--addr", addr); code != 2 {
		t.Errorf("status of a stopped daemon: exit %d, want 2\n%s", code, out)
	}
	h.decommission(h.prefix)
}

func containsAll(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
