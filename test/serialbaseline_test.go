package test

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// serialBaseline builds the benchmark's serial baseline (bench/serialbaseline)
// once for the test run, beside the phasegate binary.
var serialBaseline = sync.OnceValues(func() (string, error) {
	bin := filepath.Join(filepath.Dir(binary), "serialbaseline")
	out, err := exec.Command("go", "build", "-race", "-o", bin, "github.com/phasegate/phasegate/test/bench/serialbaseline").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build ./bench/serialbaseline: %w\n%s", err, out)
	}
	return bin, nil
})

type buildError struct {
	err error
	out string
}

func (e *buildError) Error() string {
	return "go build ./bench/serialbaseline: " + e.err.Error() + "\n" + e.out
}

// TestSerialBaselineBindsLast checks the benchmark's baseline really is the
// order of E2B's orchestrator before its fix: no answer on the port until
// reclaim and populate are done. It keeps no records, so what it leaves is
// decommissioned, as the benchmark does after each of its runs.
func TestSerialBaselineBindsLast(t *testing.T) {
	bin, err := serialBaseline()
	if err != nil {
		t.Fatal(err)
	}
	h := newHost(t)
	h.leak(h.prefix, 1, 40)
	addr := freePort(t)
	d := startBinary(t, bin, nil,
		"--listen="+addr, "--netns-dir="+h.netnsDir, "--slot-prefix="+h.prefix, "--slot-cidr="+h.cidr,
		"--slots=64", "--pool-size=4", "--drain-delay=200ms", "--stop-timeout=5s")
	var firstState string
	waitFor(t, time.Minute, "the port", func() bool {
		_, body, err := d.get("/debug/lifecycle")
		if err == nil {
			firstState = body
		}
		return err == nil
	})
	// By the time the port answers, reclaim and populate have ended.
	for _, phase := range []string{"reclaim", "storage", "populate"} {
		i := strings.Index(firstState, `"name": "`+phase+`"`)
		if i < 0 || !strings.Contains(firstState[i:i+400], `"state": "succeeded"`) {
			t.Errorf("port answered before %s succeeded", phase)
		}
	}
	d.waitServing(time.Minute)
	if !strings.Contains(d.Output(), `"msg":"reclaim report","found":40,"reclaimed":40,"failed":0`) {
		t.Errorf("no reclaim report of the 40 leaked slots:\n%s", d.Output())
	}
	d.signal(syscall.SIGTERM)
	if code := d.wait(30 * time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	h.decommission(h.prefix)
	h.assertClean(h.prefix, nil)
}
