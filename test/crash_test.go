package test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
)

// killPoints are the moments a round may kill -9 the daemon at.
var killPoints = []string{"mid-reclaim", "mid-fill", "serving-with-acquired", "mid-drain"}

// TestCrashAnywhereRestartClean kills the daemon with SIGKILL at a random
// point of its life, round after round, over a random number of leaked
// slots; every restart must reach serving and, after the last graceful stop,
// nothing with the prefix may remain. PHASEGATE_CRASH_ROUNDS sets the number
// of rounds (default 6; the long run uses 20) and PHASEGATE_CRASH_SEED the
// seed.
func TestCrashAnywhereRestartClean(t *testing.T) {
	rounds := envInt("PHASEGATE_CRASH_ROUNDS", 6)
	seed := uint64(envInt("PHASEGATE_CRASH_SEED", int(time.Now().UnixNano()%1e6)))
	r := rand.New(rand.NewPCG(seed, 1))
	t.Logf("seed %d, %d rounds", seed, rounds)

	h := newHost(t)
	addr := freePort(t)
	const slots = 3000
	args := h.args(addr, "--slots="+strconv.Itoa(slots), "--pool-size=24", "--pool-min-ready=1", "--drain-delay=300ms")
	var report []string
	nextLeak := 1001 // leaked slots get fresh indices above what the pool uses
	for round := 1; round <= rounds; round++ {
		n := r.IntN(800)
		if nextLeak+n > slots {
			nextLeak, n = 1001, min(n, slots-1001)
		}
		h.leak(h.prefix, nextLeak, n)
		nextLeak += n
		point := killPoints[r.IntN(len(killPoints))]
		before := len(h.netnsFiles(h.prefix))

		d := start(t, nil, args...)
		found := reachKillPoint(t, d, point, r)
		d.signal(syscall.SIGKILL)
		d.wait(10 * time.Second)
		report = append(report, fmt.Sprintf("round %2d: %4d leaked made, %4d netns files before start, killed %-22s %s",
			round, n, before, point, found))
	}
	// The last start must clean up everything every crash left.
	leftover := len(h.netnsFiles(h.prefix))
	d := start(t, nil, args...)
	d.waitServing(2 * time.Minute)
	d.signal(syscall.SIGTERM)
	if code := d.wait(time.Minute); code != 0 {
		t.Fatalf("final stop: exit %d", code)
	}
	report = append(report, fmt.Sprintf("final: %d netns files left by the crashes, %s", leftover, reclaimLine(d.logs.String())))
	h.stoppedCleanly(h.prefix, nil)
	t.Logf("crash rounds (seed %d):\n%s", seed, strings.Join(report, "\n"))
	writeReport(t, "crash.txt", fmt.Sprintf("seed %d\n%s\n", seed, strings.Join(report, "\n")))
}

// reachKillPoint waits until d is at point and says what it saw.
func reachKillPoint(t *testing.T, d *daemon, point string, r *rand.Rand) string {
	t.Helper()
	waitFor(t, 30*time.Second, "the port", func() bool { _, _, err := d.get("/livez"); return err == nil })
	switch point {
	case "mid-reclaim":
		// Kill while reclaim runs if it still does; a small leak may be
		// done before the first look.
		time.Sleep(time.Duration(r.IntN(50)) * time.Millisecond)
		_, body, _ := d.get("/health")
		if strings.Contains(body, "starting: phase reclaim") {
			return "(reclaim was running)"
		}
		return "(reclaim had finished)"
	case "mid-fill":
		d.waitServing(2 * time.Minute)
		return "(fill " + fillProgress(d) + ")"
	case "serving-with-acquired":
		d.waitServing(2 * time.Minute)
		conn := dial(t, d.addr)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		n := 1 + r.IntN(4)
		for i := range n {
			if _, err := phasegatev1.NewSlotsClient(conn).Acquire(ctx, &phasegatev1.AcquireRequest{Owner: "crash-" + strconv.Itoa(i)}); err != nil {
				t.Fatalf("Acquire: %v", err)
			}
		}
		return fmt.Sprintf("(%d acquired)", n)
	case "mid-drain":
		d.waitServing(2 * time.Minute)
		d.signal(syscall.SIGTERM)
		time.Sleep(time.Duration(100+r.IntN(300)) * time.Millisecond)
		return "(draining)"
	}
	t.Fatalf("unknown kill point %s", point)
	return ""
}

func fillProgress(d *daemon) string {
	_, body, _ := d.get("/debug/lifecycle")
	if i := strings.Index(body, `"name": "fill"`); i >= 0 {
		if j := strings.Index(body[i:], `"done": `); j >= 0 {
			rest := body[i+j+len(`"done": `):]
			if k := strings.IndexAny(rest, ",\n"); k > 0 {
				return rest[:k] + "/24 warm"
			}
		}
	}
	return "not started"
}

func reclaimLine(logs string) string {
	l := grepLines(logs, "reclaim report")
	if i := strings.Index(l, "found="); i >= 0 {
		return l[i:]
	}
	return l
}

func envInt(key string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(key)); err == nil && v > 0 {
		return v
	}
	return def
}

// writeReport saves a test's figures under PHASEGATE_REPORT_DIR, when set,
// for docs/RELIABILITY.md.
func writeReport(t *testing.T, name, text string) {
	dir := os.Getenv("PHASEGATE_REPORT_DIR")
	if dir == "" {
		return
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Error(err)
		return
	}
	if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
		t.Error(err)
	}
}
