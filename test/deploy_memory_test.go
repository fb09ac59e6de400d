package test

import (
	"crypto/tls"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/phasegate/phasegate/test/internal/portflood"
)

// floodUnderTheLimit floods the port of d, a deploy file's daemon running in
// cg (the memory limit the file sets), from inside the node, as users with
// no credentials, with every flood of the port's first bytes at once for
// 8 s: nobody DATA frames of 16 MiB, another user the headers of 16 MiB
// frames, eight more PING frames up to just under the bound on what the
// port reads before the handover (more connections being sniffed than the
// port takes from unprivileged peers), and one more SETTINGS frames
// without reading. The port runs TLS, as the file says; the floods
// complete their handshakes without a certificate. Unbounded, the first
// alone had the kernel kill the daemon at 128 MiB in under a second.
// Meanwhile root asks /livez every 100 ms; every answer must be 200 within
// 2 s, and afterwards the daemon must be running with no process of its
// cgroup killed for want of memory.
func floodUnderTheLimit(t *testing.T, n *node, d *daemon, cg *memoryCgroup, addr string) {
	t.Helper()
	pub := newPublicDir(t)
	target := "tls://" + addr
	type flood struct {
		uid  int
		mode string
	}
	floods := []flood{{65534, "h2data"}, {60001, "h2header"}, {60010, "noread"}}
	for uid := 60002; uid <= 60009; uid++ {
		floods = append(floods, flood{uid, "stall"})
	}
	const dur = 8 * time.Second
	waits := make([]func() portflood.Report, len(floods))
	for i, f := range floods {
		via := append([]string{"nsenter", "--net=" + n.ns, "--"}, asUID(f.uid)...)
		waits[i] = pub.portFloodVia(t, via, f.mode, target, 64, dur)
	}
	var (
		mu           sync.Mutex
		answered     int
		failures     []string
		slowest, gap time.Duration
		start        = time.Now()
		lastAnswer   = start
	)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tk := time.NewTicker(100 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-done:
				return
			case <-tk.C:
			}
			at := time.Now()
			code, err := n.httpGet("https://"+addr+"/livez", &tls.Config{InsecureSkipVerify: true}, 2*time.Second) // the kubelet's httpGet verifies nothing
			took := time.Since(at)
			mu.Lock()
			slowest = max(slowest, took)
			if err != nil || code != http.StatusOK {
				failures = append(failures, fmt.Sprintf("%s: %d %v", at.Format("15:04:05.000"), code, err))
			} else {
				answered++
				gap, lastAnswer = max(gap, time.Since(lastAnswer)), time.Now()
			}
			mu.Unlock()
		}
	})
	for i, wait := range waits {
		rep := wait()
		t.Logf("%s flood as uid %d over TLS: %d connections, %.1f MiB taken by the kernel, the longest lived %.2fs",
			floods[i].mode, floods[i].uid, rep.Attempts, float64(rep.Sent)/(1<<20), rep.Longest)
	}
	close(done)
	wg.Wait()
	gap = max(gap, time.Since(lastAnswer))
	peak, kills := cg.peak(t)
	t.Logf("under the floods (%v): /livez answered %d times, the slowest in %v, at most %v apart; the cgroup's peak %d MiB of its %d MiB",
		time.Since(start).Round(time.Millisecond), answered, slowest.Round(time.Millisecond), gap.Round(time.Millisecond), peak>>20, cg.limit>>20)
	// The kubelet's probe: a 2 s timeout, every 10 s, three failures.
	if len(failures) > 0 || gap > 3*time.Second {
		t.Errorf("/livez under the floods: %d answered, at most %v apart, %d failed: %v", answered, gap, len(failures), failures)
	}
	if kills != 0 || !d.running() {
		t.Fatalf("the daemon under its memory limit of %d MiB: %d processes killed for want of memory, running %v: %v",
			cg.limit>>20, kills, d.running(), d.Err())
	}
}
