package test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
	"github.com/phasegate/phasegate/network/leases"
	"github.com/phasegate/phasegate/test/internal/portflood"
)

// floodRig is a daemon under prlimit --nofile=floodLimit with the victim:
// a lease of root's with a 6 s TTL and an egress policy near the largest a
// request may carry, a workload in its slot, and the watch on them.
type floodRig struct {
	t         *testing.T
	pub       *publicDir
	h         *host
	d         *daemon
	root      phasegatev1.SlotsClient
	victim    *phasegatev1.AcquireResponse
	before    victimState
	work      *workload
	w         *watch
	notify    *notifySocket // systemd's end of sd_notify, with a watchdog
	portConns int           // the port's bound, as the daemon's log says
	perPeer   int
}

// floodWatchdog is the WatchdogSec the flood rig's daemon is given: it
// sends WATCHDOG=1 only once its self-probe got /livez from its own port.
const floodWatchdog = 2 * time.Second

const victimTTL = 6 * time.Second

func newFloodRig(t *testing.T, extra ...string) *floodRig {
	t.Helper()
	r := &floodRig{t: t, pub: newPublicDir(t), h: newHost(t), notify: newNotifySocket(t)}
	addr := freePort(t)
	args := r.h.args(addr, append([]string{"--slots=64"}, extra...)...)
	cmd := exec.Command("prlimit", append([]string{fmt.Sprintf("--nofile=%d", floodLimit), "--", binary}, args...)...)
	cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+r.notify.path, fmt.Sprintf("WATCHDOG_USEC=%d", floodWatchdog.Microseconds()))
	r.d = &daemon{Process: startCmd(t, cmd), t: t, addr: addr, control: filepath.Join(r.h.stateDir, "control.sock")}
	for _, a := range extra {
		if v, ok := strings.CutPrefix(a, "--control-socket="); ok {
			r.d.control = v
		}
	}
	r.d.waitServing(time.Minute)
	m := regexp.MustCompile(`msg="descriptors shared" open_files=(\d+) .* port_conns=(\d+) port_conns_per_peer=(\d+)`).FindStringSubmatch(r.d.Output())
	if m == nil || m[1] != strconv.Itoa(floodLimit) {
		t.Fatalf("the daemon's open files limit: %v, want %d (its log: %.2000s)", m, floodLimit, r.d.Output())
	}
	r.portConns, _ = strconv.Atoi(m[2])
	r.perPeer, _ = strconv.Atoi(m[3])
	r.root = r.d.slots()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req := largeAcquire()
	var err error
	if r.victim, err = r.root.Acquire(ctx, req); err != nil {
		t.Fatalf("root's Acquire of %d bytes: %v", proto.Size(req), err)
	}
	t.Logf("the victim's Acquire was %d bytes; the port may hold %d connections, %d a peer", proto.Size(req), r.portConns, r.perPeer)
	vi := r.victim.GetSlot()
	r.before = observeVictim(t, r.root, vi.GetIndex())
	inside, _, _ := strings.Cut(vi.GetInsideAddress(), "/")
	r.work = startWorkload(t, vi.GetIndex(), vi.GetNetnsPath(), inside)
	r.w = startWatch(t, r.d, r.victim)
	return r
}

// largeAcquire is root's Acquire of the victim: a policy of 4,096 entries
// in each list, each as long as an entry may be.
func largeAcquire() *phasegatev1.AcquireRequest {
	list := func(first int) []string {
		var out []string
		for c := 100; len(out) < 4096; c++ {
			for d := 100; d <= 255 && len(out) < 4096; d++ {
				out = append(out, fmt.Sprintf("%d.255.%d.%d/32", first, c, d))
			}
		}
		return out
	}
	return &phasegatev1.AcquireRequest{Owner: "victim", RequestId: "sandbox-" + strings.Repeat("v", 240),
		Ttl: durationpb.New(victimTTL), EgressPolicy: &phasegatev1.EgressPolicy{Allow: list(254), Deny: list(253)}}
}

// finish stops the watch and checks the victim: the same lease, record,
// namespace and link (its deadline aside, which the renewals move), its
// workload answering throughout, and no lease expired; then stops the
// daemon and removes everything.
func (r *floodRig) finish() {
	t := r.t
	t.Helper()
	r.w.stop()
	after := observeVictim(t, r.root, r.victim.GetSlot().GetIndex())
	b, a := proto.Clone(r.before.slot).(*phasegatev1.Slot), proto.Clone(after.slot).(*phasegatev1.Slot)
	b.ExpiresAt, a.ExpiresAt = nil, nil
	if !proto.Equal(b, a) || r.before.netnsID != after.netnsID || r.before.ifindex != after.ifindex {
		t.Errorf("the victim changed:\nbefore %v netns %d ifindex %d\nafter  %v netns %d ifindex %d",
			b, r.before.netnsID, r.before.ifindex, a, after.netnsID, after.ifindex)
	}
	notBelow(t, "after the flood, the victim's", after.usage, r.before.usage)
	ok, failed, last := r.work.finish()
	t.Logf("the victim's workload: %d echoes answered, %d failed (%v)", ok, failed, last)
	if ok == 0 || failed != 0 {
		t.Errorf("the victim's workload: %d answered, %d failed: %v", ok, failed, last)
	}
	if strings.Contains(r.d.Output(), `msg="lease expired`) {
		t.Error("a lease expired")
	}
	r.d.signal(syscall.SIGTERM)
	if code := r.d.wait(time.Minute); code != 0 {
		t.Errorf("stop: exit %d", code)
	}
	st, err := leases.Open(filepath.Join(r.h.stateDir, "slots.db"), leases.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rec, ok2, err := st.Get(int(r.victim.GetSlot().GetIndex()))
	st.Close()
	if err != nil || !ok2 || rec.LeaseID != r.victim.GetLeaseId() || rec.State != leases.Leased {
		t.Errorf("the victim's record after the stop: %+v %v %v", rec, ok2, err)
	}
	r.h.decommission(r.h.prefix)
}

// probe is one observation: a renewal of the victim's lease, a health
// check, or the daemon's descriptors and memory.
type probe struct {
	kind     string // renew, grpc, http, res
	at       time.Time
	took     time.Duration
	err      error
	fds      int
	rss, hwm int // kB
}

// watch renews the victim's lease once a second over a new connection to
// the control socket, checks health over a new connection every 100 ms
// (gRPC and HTTP in turn), and reads the daemon's descriptors and memory
// every 100 ms, until stopped.
type watch struct {
	mu     sync.Mutex
	probes []probe
	done   chan struct{}
	wg     sync.WaitGroup
}

func startWatch(t *testing.T, d *daemon, victim *phasegatev1.AcquireResponse) *watch {
	w := &watch{done: make(chan struct{})}
	every := func(d time.Duration, f func(i int) probe) {
		w.wg.Go(func() {
			tk := time.NewTicker(d)
			defer tk.Stop()
			for i := 0; ; i++ {
				select {
				case <-w.done:
					return
				case <-tk.C:
				}
				p := f(i)
				w.mu.Lock()
				w.probes = append(w.probes, p)
				w.mu.Unlock()
			}
		})
	}
	every(time.Second, func(int) probe { return renew(d.control, victim) })
	every(100*time.Millisecond, func(i int) probe {
		if i%2 == 0 {
			return checkHealthGRPC(d.addr)
		}
		return readyHTTP(d.addr)
	})
	every(100*time.Millisecond, func(int) probe { return resources(d.Pid()) })
	t.Cleanup(w.stop)
	return w
}

func (w *watch) stop() {
	select {
	case <-w.done:
	default:
		close(w.done)
	}
	w.wg.Wait()
}

// renew is root's KeepAlive of the victim on a connection of its own.
func renew(sock string, v *phasegatev1.AcquireResponse) probe {
	p := probe{kind: "renew", at: time.Now()}
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err = phasegatev1.NewSlotsClient(conn).KeepAlive(ctx, &phasegatev1.KeepAliveRequest{Index: v.GetSlot().GetIndex(), LeaseId: v.GetLeaseId()})
		cancel()
		conn.Close()
	}
	p.took, p.err = time.Since(p.at), err
	return p
}

// checkHealthGRPC is a checker's grpc.health.v1 Check on a new connection.
func checkHealthGRPC(addr string) probe {
	p := probe{kind: "grpc", at: time.Now()}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		var resp *healthpb.HealthCheckResponse
		resp, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		cancel()
		conn.Close()
		if err == nil && resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			err = fmt.Errorf("status %v", resp.GetStatus())
		}
	}
	p.took, p.err = time.Since(p.at), err
	return p
}

// readyHTTP is a checker's GET /readyz on a new connection.
func readyHTTP(addr string) probe {
	p := probe{kind: "http", at: time.Now()}
	tr := &http.Transport{DisableKeepAlives: true}
	resp, err := (&http.Client{Transport: tr, Timeout: 2 * time.Second}).Get("http://" + addr + "/readyz")
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("HTTP %d", resp.StatusCode)
		}
	}
	p.took, p.err = time.Since(p.at), err
	return p
}

// resources reads the daemon's open descriptors and memory from /proc.
func resources(pid int) probe {
	p := probe{kind: "res", at: time.Now()}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	p.fds, p.err = len(fds), err
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) >= 2 && (f[0] == "VmRSS:" || f[0] == "VmHWM:") {
			n, _ := strconv.Atoi(f[1])
			if f[0] == "VmRSS:" {
				p.rss = n
			} else {
				p.hwm = n
			}
		}
	}
	return p
}

// window is what the watch saw in [from, to).
type window struct {
	name                 string
	renewals, renewFails int
	renewErr             error
	grpc, http           []time.Duration // answered checks
	checkFails           int
	checkErr             error
	maxFDs, rss, maxRSS  int // kB; rss: at the window's start
	maxHWM               int
}

func (w *watch) window(name string, from, to time.Time) window {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := window{name: name}
	for _, p := range w.probes {
		if p.at.Before(from) || !p.at.Before(to) {
			continue
		}
		switch {
		case p.kind == "res":
			if out.rss == 0 {
				out.rss = p.rss
			}
			out.maxFDs, out.maxRSS, out.maxHWM = max(out.maxFDs, p.fds), max(out.maxRSS, p.rss), max(out.maxHWM, p.hwm)
		case p.kind == "renew":
			out.renewals++
			if p.err != nil {
				out.renewFails++
				out.renewErr = p.err
			}
		case p.err != nil:
			out.checkFails++
			out.checkErr = p.err
		case p.kind == "grpc":
			out.grpc = append(out.grpc, p.took)
		default:
			out.http = append(out.http, p.took)
		}
	}
	return out
}

// pct is the q-quantile of ds.
func pct(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

func (w window) String() string {
	r := func(d time.Duration) string { return d.Round(10 * time.Microsecond).String() }
	return fmt.Sprintf("%s: renewals %d (failed %d); health gRPC p50 %s p99 %s max %s, HTTP p50 %s p99 %s max %s (%d checks failed); "+
		"descriptors at most %d of %d; VmRSS %d MiB at the start, %d MiB at most; VmHWM %d MiB",
		w.name, w.renewals, w.renewFails, r(pct(w.grpc, .5)), r(pct(w.grpc, .99)), r(slices.Max(append(w.grpc, 0))),
		r(pct(w.http, .5)), r(pct(w.http, .99)), r(slices.Max(append(w.http, 0))), w.checkFails,
		w.maxFDs, floodLimit, w.rss>>10, w.maxRSS>>10, w.maxHWM>>10)
}

// served checks that in w every renewal was served, every health check
// answered within 2 s (the checks' timeout), and the daemon's descriptors
// stayed below its limit.
func (w window) served(t *testing.T, minRenewals int) {
	t.Helper()
	t.Log(w)
	if w.renewals < minRenewals || w.renewFails != 0 {
		t.Errorf("%s: %d of %d renewals failed (want none of at least %d): %v", w.name, w.renewFails, w.renewals, minRenewals, w.renewErr)
	}
	if w.checkFails != 0 || len(w.grpc) == 0 || len(w.http) == 0 {
		t.Errorf("%s: %d health checks failed, %d gRPC and %d HTTP answered: %v", w.name, w.checkFails, len(w.grpc), len(w.http), w.checkErr)
	}
	if w.maxFDs == 0 || w.maxFDs >= floodLimit {
		t.Errorf("%s: the daemon held %d descriptors, its limit is %d", w.name, w.maxFDs, floodLimit)
	}
}

// flood runs one flood of the port as nobody for d and returns its
// report and what the watch saw meanwhile.
func (r *floodRig) flood(mode string, n int, d time.Duration) (portflood.Report, window) {
	r.t.Helper()
	return r.floodAs(r.pub, mode, r.d.addr, n, d)
}

// floodAs is flood against addr, with the client in pub.
func (r *floodRig) floodAs(pub *publicDir, mode, addr string, n int, d time.Duration) (portflood.Report, window) {
	r.t.Helper()
	from := time.Now()
	rep := pub.portFlood(r.t, mode, addr, n, d)()
	to := time.Now()
	r.watchdogKept(from, to)
	return rep, r.w.window("flood "+mode+" "+addr, from, to)
}

// watchdogKept checks that systemd's watchdog would not have fired
// between from and to: the daemon's self-probe of its own port, which
// goes before every WATCHDOG=1, was answered under the flood, never more
// than WatchdogSec apart.
func (r *floodRig) watchdogKept(from, to time.Time) {
	t := r.t
	t.Helper()
	last, widest, n := from, time.Duration(0), 0
	for _, m := range r.notify.all(0, "WATCHDOG") {
		if m.at.After(from) && m.at.Before(to) {
			widest, last, n = max(widest, m.at.Sub(last)), m.at, n+1
		}
	}
	widest = max(widest, to.Sub(last))
	t.Logf("under the flood: WATCHDOG=1 %d times, at most %v apart", n, widest.Round(time.Millisecond))
	if widest >= floodWatchdog {
		t.Errorf("WATCHDOG=1 %v apart under the flood, WatchdogSec=%v: systemd would have killed the daemon", widest, floodWatchdog)
	}
	if strings.Contains(r.d.Output(), "liveness self-check failed") {
		t.Errorf("the daemon's self-probe failed under the flood:\n%s", r.d.Output())
	}
}

// quiet lets d pass without a flood and returns what the watch saw.
func (r *floodRig) quiet(d time.Duration) window {
	from := time.Now()
	time.Sleep(d) // the quiet phase is a span of time, not a condition
	return r.w.window("quiet", from, time.Now())
}
