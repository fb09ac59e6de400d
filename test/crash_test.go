package test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
)

// killPoints are the moments a round may kill -9 the daemon at, and
// "sigterm", a clean restart.
var killPoints = []string{"mid-restore", "mid-verify", "mid-verify-burst", "mid-reclaim", "mid-fill", "mid-acquire-burst", "mid-drain", "sigterm"}

// bulkLeases are leased at the test's start beside the workloads' so that
// the verification of the restored leases after SERVING lasts long enough
// to be seen, and killed, at every start.
const bulkLeases = 400

// ledger is what the clients were told: every lease an Acquire answered,
// and the requests whose answer never came (the daemon died first).
type ledger struct {
	mu      sync.Mutex
	told    map[string]held // by request id
	pending map[string]string
}

func (l *ledger) add(h held) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.told[h.requestID] = h
	delete(l.pending, h.requestID)
}

func (l *ledger) all() []held {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []held
	for _, h := range l.told {
		out = append(out, h)
	}
	return out
}

// TestCrashAnywhereRestartClean kills the daemon with SIGKILL at a random
// point of its life, round after round, over a random number of leaked
// slots, with leases held by several owners and workloads running in some
// of their slots. The first two rounds kill it while it verifies the
// restored leases after SERVING, alone and under a burst of Acquires. After
// every restart every lease a client was told about is back with its
// owner, as it was described and over the same namespace, a request whose answer was lost gets its slot on
// a retry, no index is held twice, and the workloads answer throughout,
// the daemon being down included; after the last graceful stop the host
// holds only what the records name, and nothing once decommissioned.
// PHASEGATE_CRASH_ROUNDS sets the number of rounds (default 6; the long
// run uses 20) and PHASEGATE_CRASH_SEED the random seed of the rounds.
func TestCrashAnywhereRestartClean(t *testing.T) {
	rounds := envInt("PHASEGATE_CRASH_ROUNDS", 6)
	seed := uint64(envInt("PHASEGATE_CRASH_SEED", int(time.Now().UnixNano()%1e6)))
	r := rand.New(rand.NewPCG(seed, 1))
	t.Logf("seed %d, %d rounds", seed, rounds)

	h := newHost(t)
	addr := freePort(t)
	const slots = 3000
	args := h.args(addr, "--slots="+strconv.Itoa(slots), "--pool-size=24", "--pool-min-ready=1", "--drain-delay=300ms")
	book := &ledger{told: map[string]held{}, pending: map[string]string{}}

	// Leases with workloads, probed from the host for the whole test.
	d := start(t, nil, args...)
	d.waitServing(2 * time.Minute)
	c := d.slots()
	var work []*workload
	for i := range 3 {
		l := acquire(t, c, fmt.Sprint("sandbox-", i), fmt.Sprint("w", i), 0)
		book.add(l)
		inside, _, _ := strings.Cut(l.slot.GetInsideAddress(), "/")
		work = append(work, startWorkload(t, l.slot.GetIndex(), l.slot.GetNetnsPath(), inside))
	}
	acquireBulk(t, c, book, bulkLeases)
	d.signal(syscall.SIGKILL)
	d.wait(10 * time.Second)

	var report []string
	nextLeak := 1001 // leaked slots get indices above what the pool uses
	for round := 1; round <= rounds; round++ {
		n := r.IntN(800)
		if nextLeak+n > slots {
			nextLeak = 1001
		}
		made := h.leak(h.prefix, nextLeak, n)
		nextLeak += n
		point := killPoints[r.IntN(len(killPoints))]
		if round <= 2 {
			point = killPoints[round] // mid-verify, mid-verify-burst
		}

		d := start(t, nil, args...)
		found := reachKillPoint(t, d, point, r, book)
		if point == "sigterm" {
			d.signal(syscall.SIGTERM)
			if code := d.wait(time.Minute); code != 0 {
				t.Fatalf("round %d: exit %d after SIGTERM", round, code)
			}
		} else {
			d.signal(syscall.SIGKILL)
			d.wait(10 * time.Second)
		}
		report = append(report, fmt.Sprintf("round %2d: %4d leaked made, killed %-18s %s", round, made, point, found))
	}

	// The last start: every lease the clients were told about, and those
	// whose answer was lost once retried; then a clean stop.
	d = start(t, nil, args...)
	d.waitReclaimed(2 * time.Minute)
	c = d.slots()
	retryPending(t, c, book)
	checkLeases(t, c, book.all(), "after the last restart")
	for _, w := range work {
		ok, failed, last := w.finish()
		report = append(report, fmt.Sprintf("workload in slot %d: %d probes answered, %d failed", w.slot, ok, failed))
		if failed != 0 || ok == 0 {
			t.Errorf("workload in slot %d lost its network: %d probes failed (last: %v)", w.slot, failed, last)
		}
	}
	d.signal(syscall.SIGTERM)
	if code := d.wait(time.Minute); code != 0 {
		t.Fatalf("final stop: exit %d", code)
	}
	report = append(report, fmt.Sprintf("final: %d leases held by their owners, %s", len(book.all()), reclaimLine(d.Output())))
	h.stoppedCleanly(h.prefix, nil)
	t.Logf("crash rounds (seed %d):\n%s", seed, strings.Join(report, "\n"))
	writeReport(t, "crash.txt", fmt.Sprintf("seed %d\n%s\n", seed, strings.Join(report, "\n")))
}

// retryPending retries every Acquire whose answer was lost, with its
// request id: it must get a slot (the one the daemon recorded, if it did),
// and from then on the client holds it.
func retryPending(t *testing.T, c phasegatev1.SlotsClient, book *ledger) {
	t.Helper()
	book.mu.Lock()
	pending := maps.Clone(book.pending)
	book.mu.Unlock()
	for req, owner := range pending {
		book.add(acquire(t, c, owner, req, 0))
	}
}

// acquireBulk leases n slots with 8 callers, each to an owner of its own.
func acquireBulk(t *testing.T, c phasegatev1.SlotsClient, book *ledger, n int) {
	t.Helper()
	var wg sync.WaitGroup
	var next atomic.Int64
	for w := range 8 {
		wg.Go(func() {
			for i := next.Add(1); i <= int64(n); i = next.Add(1) {
				book.add(acquire(t, c, fmt.Sprint("bulk-", w), fmt.Sprint("bulk-", i), 0))
			}
		})
	}
	wg.Wait()
}

// reachKillPoint starts d, checks that the leases are back, waits until d
// is at point and says what it saw.
func reachKillPoint(t *testing.T, d *daemon, point string, r *rand.Rand, book *ledger) string {
	t.Helper()
	waitFor(t, 30*time.Second, "the port", func() bool { _, _, err := d.get("/livez"); return err == nil })
	switch point {
	case "mid-verify":
		// Some verified, some not.
		seen := verifying(t, d, func(done, total int64, _ string) bool { return done > 0 })
		d.signal(syscall.SIGKILL)
		return seen + verifyEnded(d)
	case "mid-verify-burst":
		// Serving, and Acquires answered while leases are still verified.
		seen := verifying(t, d, func(_, _ int64, state string) bool { return state == "serving" })
		n := acquireBurst(t, d.slots(), book, time.Duration(r.IntN(10))*time.Millisecond, func() { d.signal(syscall.SIGKILL) })
		return fmt.Sprintf("%s, %d acquired in the burst%s", seen, n, verifyEnded(d))
	}
	if point == "mid-restore" {
		time.Sleep(time.Duration(r.IntN(30)) * time.Millisecond)
		_, body, _ := d.get("/health")
		if strings.Contains(body, "starting") {
			return "(starting)"
		}
		return "(serving already)"
	}
	d.waitServing(2 * time.Minute)
	c := d.slots()
	retryPending(t, c, book)
	checkLeases(t, c, book.all(), "after a restart")
	switch point {
	case "mid-reclaim":
		_, body, _ := d.get("/health")
		time.Sleep(time.Duration(r.IntN(100)) * time.Millisecond)
		if strings.Contains(body, "reclaim-dead") {
			return "(reclaiming dead slots in the background)"
		}
		return "(nothing left to reclaim)"
	case "mid-fill":
		return "(fill " + fillProgress(d) + ")"
	case "mid-acquire-burst":
		n := acquireBurst(t, c, book, time.Duration(50+r.IntN(300))*time.Millisecond, func() { d.signal(syscall.SIGKILL) })
		return fmt.Sprintf("(%d acquired in the burst)", n)
	case "mid-drain":
		d.signal(syscall.SIGTERM)
		time.Sleep(time.Duration(100+r.IntN(300)) * time.Millisecond)
		return "(draining)"
	case "sigterm":
		return "(clean restart)"
	}
	t.Fatalf("unknown kill point %s", point)
	return ""
}

// verifying waits until d's lifecycle shows the verification of the
// restored leases (it has some from the bulk) where want says, or its end,
// and says what it saw: the kill that follows lands in the verification
// unless it ended in between.
func verifying(t *testing.T, d *daemon, want func(done, total int64, state string) bool) string {
	t.Helper()
	seen := "(verified before seen)"
	waitFor(t, time.Minute, "the verification of the restored leases", func() bool {
		_, body, err := d.get("/debug/lifecycle")
		if err != nil {
			return false
		}
		var v struct {
			State string
			Tasks []struct {
				Name, State string
				Progress    struct{ Done, Total int64 }
			}
		}
		if json.Unmarshal([]byte(body), &v) != nil {
			return false
		}
		for _, tk := range v.Tasks {
			if tk.Name != "verify-leases" {
				continue
			}
			if tk.State != "running" {
				return true // it ended before it was seen
			}
			if tk.Progress.Total == 0 {
				return false // not counted yet
			}
			seen = fmt.Sprintf("(verifying, %s: %d of %d verified)", v.State, tk.Progress.Done, tk.Progress.Total)
			return want(tk.Progress.Done, tk.Progress.Total, v.State)
		}
		return false // not started yet: every start here has leases to verify
	})
	return seen
}

// acquireBurst acquires with 4 owners at once for d, then kills the daemon
// among the calls. A refused call is retried with its request id (the
// daemon may not serve yet) until the kill. No answer may name an index a
// client holds already; every answer goes into the book, and the requests
// whose answer never came stay pending. It returns how many answers came.
func acquireBurst(t *testing.T, c phasegatev1.SlotsClient, book *ledger, d time.Duration, kill func()) int64 {
	t.Helper()
	taken := map[uint32]bool{}
	for _, h := range book.all() {
		taken[h.slot.GetIndex()] = true
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var n atomic.Int64
	var mu sync.Mutex
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				owner := fmt.Sprintf("burst-%d", w)
				req := fmt.Sprintf("%s-%d-%d", owner, time.Now().UnixNano(), i)
				book.mu.Lock()
				book.pending[req] = owner
				book.mu.Unlock()
				var resp *phasegatev1.AcquireResponse
				var err error
				for {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					resp, err = c.Acquire(ctx, &phasegatev1.AcquireRequest{Owner: owner, RequestId: req})
					cancel()
					select {
					case <-stop:
					default:
						if err != nil {
							time.Sleep(2 * time.Millisecond)
							continue
						}
					}
					break
				}
				if err != nil {
					return // the daemon is gone: the request stays pending
				}
				mu.Lock()
				dup := taken[resp.GetSlot().GetIndex()]
				taken[resp.GetSlot().GetIndex()] = true
				mu.Unlock()
				if dup {
					t.Errorf("Acquire handed out slot %d, which a client holds already", resp.GetSlot().GetIndex())
				}
				h, err := heldOf(owner, req, resp)
				if err != nil {
					t.Error(err)
					return
				}
				book.add(h)
				n.Add(1)
			}
		})
	}
	time.Sleep(d)
	// At least one answer (the first calls may come before SERVING).
	for deadline := time.Now().Add(5 * time.Second); n.Load() == 0 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	kill()
	close(stop)
	wg.Wait()
	return n.Load()
}

// verifyEnded says, once d is killed, whether its verification of the
// restored leases had ended before.
func verifyEnded(d *daemon) string {
	d.wait(10 * time.Second)
	if strings.Contains(d.Output(), `msg="restored leases verified"`) {
		return "; the verification had ended"
	}
	return "; killed during the verification"
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

// TestKillDuringAcquireBurst kills the daemon with SIGKILL in the middle of
// a burst of Acquires from 16 callers, round after round, with its state
// directory on tmpfs, where the records are committed without fsync (the
// daemon says so at the start). After every restart the state file opens
// whole (nothing moved aside, no safe mode), every lease a caller was told
// of is back with its owner and its lease id (KeepAlive with it succeeds),
// and a request whose answer was lost gets its slot on a retry.
func TestKillDuringAcquireBurst(t *testing.T) {
	rounds := envInt("PHASEGATE_CRASH_ROUNDS", 6)
	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 3))
	h := newHost(t)
	state, err := os.MkdirTemp("/dev/shm", "phasegate-burst-state-")
	if err != nil {
		t.Skipf("no tmpfs for the state directory: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(state) })
	h.stateDir = state
	addr := freePort(t)
	const warm = 32
	args := h.args(addr, "--slots=2000", "--pool-size="+strconv.Itoa(warm), "--pool-min-ready=1", "--control-rate=0")
	book := &ledger{told: map[string]held{}, pending: map[string]string{}}

	var report []string
	for round := 1; round <= rounds; round++ {
		d := start(t, nil, args...)
		d.waitServing(2 * time.Minute)
		if !strings.Contains(grepLines(d.Output(), "state file open"), "fsync=false") {
			t.Fatalf("round %d: the daemon does not say it commits without fsync on tmpfs:\n%s", round, grepLines(d.Output(), "state file"))
		}
		c := d.slots()
		retryPending(t, c, book)
		checkBurstLeases(t, c, book, fmt.Sprintf("round %d, after the restart", round))
		waitWarm(t, c, warm)
		n := acquireUntilKilled(d, c, book, 16, time.Duration(20+r.IntN(300))*time.Millisecond)
		d.wait(10 * time.Second)
		book.mu.Lock()
		report = append(report, fmt.Sprintf("round %d: killed with %d acquired in the burst, %d answers lost", round, n, len(book.pending)))
		book.mu.Unlock()
	}
	d := start(t, nil, args...)
	d.waitServing(2 * time.Minute)
	c := d.slots()
	retryPending(t, c, book)
	checkBurstLeases(t, c, book, "after the last restart")
	if aside, _ := filepath.Glob(filepath.Join(state, "*.corrupt-*")); len(aside) > 0 || strings.Contains(d.Output(), "safe mode") {
		t.Errorf("a state file was found unusable after a kill: %v\n%s", aside, grepLines(d.Output(), "state file"))
	}
	d.signal(syscall.SIGTERM)
	if code := d.wait(time.Minute); code != 0 {
		t.Fatalf("final stop: exit %d", code)
	}
	h.stoppedCleanly(h.prefix, nil)
	t.Logf("%d leases held at the end:\n%s", len(book.all()), strings.Join(report, "\n"))
}

// waitWarm waits until the pool holds n warm slots, so that a burst is
// answered from the pool.
func waitWarm(t *testing.T, c phasegatev1.SlotsClient, n int) {
	t.Helper()
	waitFor(t, 2*time.Minute, fmt.Sprintf("%d warm slots", n), func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		list, err := c.List(ctx, &phasegatev1.ListRequest{IncludeFree: true})
		if err != nil {
			return false
		}
		got := 0
		for _, s := range list.GetSlots() {
			if s.GetState() == phasegatev1.SlotState_SLOT_STATE_WARM {
				got++
			}
		}
		return got >= n
	})
}

// acquireUntilKilled runs callers that Acquire with fresh request ids,
// noting each in book before the call and its lease once answered, and
// kills d with SIGKILL after delay. It returns the leases acquired.
func acquireUntilKilled(d *daemon, c phasegatev1.SlotsClient, book *ledger, callers int, delay time.Duration) int64 {
	var (
		wg sync.WaitGroup
		n  atomic.Int64
	)
	for w := range callers {
		wg.Go(func() {
			owner := fmt.Sprintf("burst-%d", w%4)
			for i := 0; ; i++ {
				req := fmt.Sprintf("%s-%d-%d-%d", owner, w, time.Now().UnixNano(), i)
				book.mu.Lock()
				book.pending[req] = owner
				book.mu.Unlock()
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				resp, err := c.Acquire(ctx, &phasegatev1.AcquireRequest{Owner: owner, RequestId: req})
				cancel()
				if err != nil {
					return // the daemon is gone: the request stays pending
				}
				book.add(held{owner: owner, requestID: req, leaseID: resp.GetLeaseId(), slot: resp.GetSlot()})
				n.Add(1)
			}
		})
	}
	time.Sleep(delay)
	d.signal(syscall.SIGKILL)
	wg.Wait()
	return n.Load()
}

// checkBurstLeases checks every lease in book: held by its owner (List),
// under the lease id the caller was told (KeepAlive with it succeeds).
func checkBurstLeases(t *testing.T, c phasegatev1.SlotsClient, book *ledger, when string) {
	t.Helper()
	all := book.all()
	checkLeases(t, c, all, when)
	for _, h := range all {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := c.KeepAlive(ctx, &phasegatev1.KeepAliveRequest{Index: h.slot.GetIndex(), LeaseId: h.leaseID})
		cancel()
		if err != nil {
			t.Errorf("%s: slot %d: KeepAlive with the lease id its caller was told: %v", when, h.slot.GetIndex(), err)
		}
	}
}
