package test

import (
	"syscall"
	"testing"
	"time"
)

// A host whose every slot index is leaked still serves, with the default
// background reclaim: the populate phase reclaims the dead slots its warm
// slots need first (before, it waited for a warm slot forever, while the
// background reclaim that would free an index waited for populate), and
// the background reclaims the rest.
func TestEveryIndexLeakedStillServes(t *testing.T) {
	h := newHost(t)
	const n = 16
	if got := h.leak(h.prefix, 1, n); got != n {
		t.Fatalf("leaked %d slots, want %d", got, n)
	}
	d := start(t, nil, h.args(freePort(t), "--slots=16", "--pool-size=4", "--pool-min-ready=2", "--populate-timeout=30s")...)
	d.waitServing(time.Minute)
	d.waitReclaimed(time.Minute)
	waitFor(t, time.Minute, "the pool to fill to 4 warm slots", func() bool {
		return len(h.links(h.prefix)) == 4
	})
	d.signal(syscall.SIGTERM)
	if code := d.wait(time.Minute); code != 0 {
		t.Fatalf("stop: exit %d", code)
	}
	h.decommission(h.prefix)
}
