package test

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestLockRace starts ten daemons on one state dir at once: exactly one
// serves, the others exit 1 naming its pid.
func TestLockRace(t *testing.T) {
	h := newHost(t)
	const n = 10
	daemons := make([]*daemon, n)
	var wg sync.WaitGroup
	for i := range daemons {
		wg.Go(func() { daemons[i] = start(t, nil, h.args(freePort(t), "--slots=64")...) })
	}
	wg.Wait()

	// Wait until all but one have exited (the condition, not a fixed time),
	// then sort them into the one still running and the ones that lost.
	exited := func(d *daemon) bool {
		select {
		case <-d.Done():
			return true
		default:
			return false
		}
	}
	waitFor(t, 30*time.Second, "all daemons but one to exit", func() bool {
		n := 0
		for _, d := range daemons {
			if exited(d) {
				n++
			}
		}
		return n >= len(daemons)-1
	})
	var winner *daemon
	var losers []*daemon
	var slowest time.Duration
	for _, d := range daemons {
		if !exited(d) {
			winner = d
			continue
		}
		if code := d.wait(0); code != 1 {
			t.Errorf("a daemon exited %d, want 1:\n%s", code, d.Output())
		}
		losers = append(losers, d)
		slowest = max(slowest, d.Exited().Sub(d.Began()))
	}
	if winner == nil {
		t.Fatal("no daemon kept running")
	}
	winner.waitServing(time.Minute)
	// How fast the losers exit is a figure, reported below, not a pass
	// condition: ten race-detector builds on a shared two-core machine
	// take from 0.2 to 4 s. That they do not wait for the lock is what
	// the 30 s bound above holds them to.
	pid := "pid " + strconv.Itoa(winner.Pid())
	for _, d := range losers {
		if !strings.Contains(d.Output(), pid) {
			t.Errorf("a losing daemon does not name %s:\n%s", pid, d.Output())
		}
	}
	t.Logf("%d losers exited 1 naming %s; the slowest exited %v after its exec", len(losers), pid, slowest)
	writeReport(t, "lock.txt", fmt.Sprintf("%d daemons at once: 1 served, %d exited 1 naming the holder; slowest exit %v after exec (race-detector build, 10 processes on 2 cores)\n", n, len(losers), slowest.Round(time.Millisecond)))

	// A lock file left by a killed daemon does not block the next one.
	winner.signal(syscall.SIGKILL)
	winner.wait(10 * time.Second)
	next := start(t, nil, h.args(freePort(t), "--slots=64")...)
	next.waitServing(time.Minute)
	next.signal(syscall.SIGTERM)
	if code := next.wait(30 * time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
}

// TestLockGuardsTheSlotsNotTheStateDir: a second daemon with another state
// directory but the same netns directory and prefix must not start beside
// the first (it would reclaim the first one's live slots), and neither may
// `phasegate reclaim`. Before, the lock lived in the state directory and
// both daemons served.
func TestLockGuardsTheSlotsNotTheStateDir(t *testing.T) {
	h := newHost(t)
	first := start(t, nil, h.args(freePort(t), "--slots=64")...)
	first.waitServing(time.Minute)
	pid := "pid " + strconv.Itoa(first.Pid())

	otherState := filepath.Join(t.TempDir(), "other-state")
	args := h.args(freePort(t), "--slots=64", "--state-dir="+otherState)
	second := start(t, nil, args...)
	if code := second.wait(30 * time.Second); code != 1 {
		t.Fatalf("second daemon exited %d, want 1:\n%s", code, second.Output())
	}
	if out := second.Output(); !strings.Contains(out, pid) || !strings.Contains(out, h.prefix) {
		t.Errorf("second daemon does not name %s and the prefix %s:\n%s", pid, h.prefix, out)
	}

	out, err := runBinary("reclaim", "--netns-dir="+h.netnsDir, "--slot-prefix="+h.prefix, "--slots=64", "--state-dir="+otherState)
	if err == nil || !strings.Contains(out, pid) {
		t.Errorf("reclaim beside a daemon: err %v, output:\n%s", err, out)
	}

	// Another prefix in the same directory is another set of slots (with
	// addresses of its own: a CIDR is one daemon's).
	h2 := *h
	h2.prefix = h.prefix[:len(h.prefix)-1] + "x-"
	h2.cidr = claimCIDR(t, h2.prefix)
	t.Cleanup(func() { h2.sweep(h2.prefix) })
	beside := start(t, nil, h2.args(freePort(t), "--slots=64", "--state-dir="+otherState)...)
	beside.waitServing(time.Minute)
	first.signal(syscall.SIGTERM)
	beside.signal(syscall.SIGTERM)
	if code := first.wait(30 * time.Second); code != 0 {
		t.Errorf("first daemon exited %d", code)
	}
	if code := beside.wait(30 * time.Second); code != 0 {
		t.Errorf("daemon beside it exited %d", code)
	}
}
