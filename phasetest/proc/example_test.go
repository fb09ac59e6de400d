package proc_test

import (
	"syscall"
	"testing"
	"time"

	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/phasetest"
	"github.com/phasegate/phasegate/phasetest/proc"
)

// A black-box test of a service whose start waits on something the test
// holds (here its stdin; in examples/adopter an upstream the test serves):
// its order, its health gated on serving, its orderly stop. The test
// package's TestMain runs the tests through bins.Main.
func Example() {
	test := func(t *testing.T, bins *proc.Builds, release func()) {
		p := proc.Start(t, bins.Build(t, "."), proc.Args("-listen", "127.0.0.1:0", "-log-format", "json"))
		s := p.Follow()
		h := proc.WatchHealth(t, p.Addr())
		h.WaitAnswer(t, proc.Answer.NotServing, time.Minute)
		release()
		phasetest.WaitState(t, s, lifecycle.StateServing, time.Minute)
		h.WaitServing(t, time.Minute)
		phasetest.AssertOrder(t, s.Events(0), "config", "db", "serve")
		h.AssertGated(t, s.Events(0))
		p.Signal(syscall.SIGTERM)
		if code := p.Wait(time.Minute); code != 0 {
			t.Fatalf("exit code %d after SIGTERM, want 0", code)
		}
	}
	_ = test
}
