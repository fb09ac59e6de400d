package test

import (
	"bufio"
	"context"
	"encoding/json"
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
	"github.com/phasegate/phasegate/server"
	"github.com/phasegate/phasegate/test/internal/portflood"
)

// The port flood of docs/SECURITY.md ("Bounds of the two surfaces"),
// scaled down: the daemon runs under `prlimit --nofile=1024` with a victim
// root leases for 6 s and renews once a second over the control socket, a
// new connection each time, while nobody floods the open port from a process of its own. The port's bounds
// refuse what is over them at accept, the descriptors the control socket
// and the daemon's own work need are never the port's, and the victim is
// untouched afterwards: every renewal served, health answering, the same
// namespace, record and link, its workload answering, the lease never
// expired.

// floodLimit is the daemon's open files limit in these tests.
const floodLimit = 1024

// portFloodEnv makes this test binary, run as another user, the flooding
// client of test/internal/portflood: its value is the flood's spec,
// "MODE|ADDR|N|SECONDS".
const portFloodEnv = "PHASEGATE_TEST_PORT_FLOOD"

func init() {
	if v := os.Getenv(portFloodEnv); v != "" {
		os.Exit(portflood.Run(v, os.Stdout, os.Stderr))
	}
}

// portFlood runs the flooding client as nobody against addr until it is
// ready, and returns a function that waits for its report.
func (p *publicDir) portFlood(t *testing.T, mode, addr string, n int, d time.Duration) (wait func() portflood.Report) {
	t.Helper()
	return p.portFloodVia(t, []string{"runuser", "-u", "nobody", "--"}, mode, addr, n, d)
}

// asUID runs a command as uid (and its gid), with no supplementary group:
// a user that need not exist in the password file.
func asUID(uid int) []string {
	id := strconv.Itoa(uid)
	return []string{"setpriv", "--reuid=" + id, "--regid=" + id, "--clear-groups", "--"}
}

// portFloodVia is portFlood with the client run by the command via, which
// ends in the one that drops root (runuser, asUID).
func (p *publicDir) portFloodVia(t *testing.T, via []string, mode, addr string, n int, d time.Duration) (wait func() portflood.Report) {
	t.Helper()
	cmd := exec.Command(via[0], append(via[1:], p.testBinary)...)
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s|%s|%d|%d", portFloodEnv, mode, addr, n, int(d.Seconds())))
	cmd.Dir, cmd.Stderr = p.dir, os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	r := bufio.NewReader(out)
	if line, err := r.ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("the %s flood as nobody: %q %v", mode, line, err)
	}
	return func() portflood.Report {
		t.Helper()
		line, err := r.ReadString('\n')
		var rep portflood.Report
		if err != nil || json.Unmarshal([]byte(line), &rep) != nil {
			t.Fatalf("the %s flood's report: %q %v", mode, line, err)
		}
		if err := cmd.Wait(); err != nil {
			t.Fatalf("the %s flood: %v", mode, err)
		}
		return rep
	}
}

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

// The port's bounds under nobody's floods, each for 10 s beside a quiet
// phase of the same daemon: as many gRPC connections as nobody can open
// with a Check each, held; TCP connections that never send a byte; and
// Acquire calls of 4 MiB without credentials, 256 at once. Nobody gets its
// peer's bound and no more, every renewal of root's is served, health
// answers, the daemon's descriptors stay below its limit and its memory
// does not follow the messages.
func TestPortFloodLeavesTheVictimAlone(t *testing.T) {
	r := newFloodRig(t)
	quiet := r.quiet(5 * time.Second)
	quiet.served(t, 4)
	sniffingPerPeer := server.LimitsFor(r.portConns).MaxSniffingPerPeer
	for _, tc := range []struct {
		mode string
		n    int
		// reason is the bound that refuses the flood, as
		// phasegate_conns_refused_total names it: a gRPC client is
		// over its peer's connections, a silent one over its peer's
		// connections still being decided.
		reason string
		want   func(portflood.Report) bool
	}{
		{"grpc", 2000, "per_peer", func(f portflood.Report) bool { return f.Held == r.perPeer && f.Refused > 0 }},
		{"silent", 2000, "sniffing", func(f portflood.Report) bool { return f.Held > 0 && f.Held <= sniffingPerPeer && f.Refused > 0 }},
		{"bigacquire", 256, "", func(f portflood.Report) bool {
			return f.Attempts > 256 && f.Codes["OK"] == 0 && f.Codes["ResourceExhausted"]+f.Codes["Unauthenticated"] == f.Attempts
		}},
	} {
		refused := func() float64 {
			return metricValue(scrapeMetrics(t, r.d), "phasegate_conns_refused_total", "surface", "port", "reason", tc.reason)
		}
		var before float64
		if tc.reason != "" {
			before = refused()
		}
		rep, w := r.flood(tc.mode, tc.n, 10*time.Second)
		t.Logf("%s flood as nobody: %+v", tc.mode, rep)
		w.served(t, 8)
		if !tc.want(rep) {
			t.Errorf("%s flood as nobody: %+v; the port's bound is %d connections a peer, %d of them being decided", tc.mode, rep, r.perPeer, sniffingPerPeer)
		}
		if tc.reason != "" {
			if after := refused(); after <= before {
				t.Errorf("%s flood: phasegate_conns_refused_total{%s} went from %v to %v", tc.mode, tc.reason, before, after)
			}
		}
		// 256 messages of 4 MiB in flight would be a GiB: what nobody's
		// calls may take is 16 KiB each.
		if grown := (w.maxRSS - quiet.rss) >> 10; tc.mode == "bigacquire" && grown > 64 {
			t.Errorf("during the big Acquires the daemon's memory grew by %d MiB", grown)
		}
	}
	r.finish()
}

// With no bound per peer (--port-conns-per-peer above the port's), nobody
// alone reaches the port's total: it holds all but the part kept for root,
// whose renewals and checks go on, and the descriptors the control
// socket and the daemon's work need are still there.
func TestPortFloodToTheTotalBound(t *testing.T) {
	r := newFloodRig(t, "--port-conns-per-peer=100000")
	r.quiet(3*time.Second).served(t, 2)
	others := r.portConns - server.LimitsFor(r.portConns).PrivilegedConns
	rep, w := r.flood("grpc", 2000, 10*time.Second)
	t.Logf("grpc flood as nobody: %+v", rep)
	w.served(t, 8)
	if rep.Held != others || rep.Refused == 0 {
		t.Errorf("grpc flood as nobody: held %d, want the %d the port leaves unprivileged peers, and some refused", rep.Held, others)
	}
	if v := metricValue(scrapeMetrics(t, r.d), "phasegate_conns_refused_total", "surface", "port", "reason", "total"); v <= 0 {
		t.Errorf("phasegate_conns_refused_total{total} = %v after a flood to the total", v)
	}
	rep, w = r.flood("silent", 2000, 10*time.Second)
	t.Logf("silent flood as nobody: %+v", rep)
	w.served(t, 8)
	if rep.Held == 0 || rep.Held > others {
		t.Errorf("silent flood as nobody: held %d, want some and at most %d", rep.Held, others)
	}
	r.finish()
}

// A daemon that cannot take connections at all — its open files limit
// lowered under what it holds, so that every accept fails with EMFILE — for
// longer than the victim's TTL: root's renewals fail meanwhile, and the
// lease outlives its deadline, deferred, not expired; once the daemon can
// take calls again, root renews it and nothing of the victim changed.
func TestLeaseOutlivesADaemonOutOfDescriptors(t *testing.T) {
	r := newFloodRig(t)
	r.quiet(3*time.Second).served(t, 2)
	// The kernel gives the lowest free descriptor number, refused when it
	// is not below the limit: with the limit at 3 (standard streams,
	// never closed) no descriptor can be had, whatever else closes.
	pid := strconv.Itoa(r.d.Pid())
	run(t, "prlimit", "--pid", pid, fmt.Sprintf("--nofile=3:%d", floodLimit))
	from := time.Now()
	restored := false
	restore := func() {
		if !restored {
			restored = true
			run(t, "prlimit", "--pid", pid, fmt.Sprintf("--nofile=%d", floodLimit))
		}
	}
	t.Cleanup(restore)
	// Until the lease is well past its deadline with no renewal served.
	waitFor(t, time.Minute, "the victim's deadline to pass with its renewals failing", func() bool {
		w := r.w.window("", from, time.Now())
		return w.renewFails >= 4 && w.renewFails == w.renewals && time.Since(from) > victimTTL+2*time.Second
	})
	restore()
	starved := r.w.window("out of descriptors", from, time.Now())
	t.Log(starved)
	var back time.Time
	waitFor(t, 30*time.Second, "a renewal served once the daemon has descriptors again", func() bool {
		r.w.mu.Lock()
		defer r.w.mu.Unlock()
		for _, p := range slices.Backward(r.w.probes) {
			if p.kind == "renew" && p.err == nil && p.at.After(from) {
				back = p.at
				return true
			}
		}
		return false
	})
	t.Logf("the first renewal served again came %v after the limit was lowered", back.Sub(from).Round(time.Millisecond))
	r.quiet(3*time.Second).served(t, 2)
	if !strings.Contains(r.d.Output(), `msg="lease expiry deferred`) {
		t.Error(`no "lease expiry deferred" in the log: the lease's deadline passed while the daemon was out of descriptors`)
	}
	if v := metricValue(scrapeMetrics(t, r.d), "phasegate_conns_refused_total", "surface", "socket", "reason", "accept_failed"); v <= 0 {
		t.Errorf("phasegate_conns_refused_total{socket, accept_failed} = %v", v)
	}
	r.finish()
}

// A tenant the policy lets lease (nobody, in the socket's group) opens as
// many connections to the control socket as it can, one List each, and
// holds them: it gets its uid's bound, and root's renewals, which have a
// share of the socket no tenant can take, go on.
func TestControlSocketFloodByATenant(t *testing.T) {
	pub := newPublicDir(t)
	sock := filepath.Join(pub.dir, "control.sock")
	r := newFloodRig(t, "--control-socket="+sock, "--control-group=nogroup", "--allow=uid:65534=tenant-b-*")
	r.quiet(3*time.Second).served(t, 2)
	m := regexp.MustCompile(`control_conns_per_uid=(\d+)`).FindStringSubmatch(r.d.Output())
	if m == nil {
		t.Fatal("the daemon's log does not say the control socket's bound per uid")
	}
	perUID, _ := strconv.Atoi(m[1])
	rep, w := r.floodAs(pub, "grpc", "unix://"+sock, 500, 10*time.Second)
	t.Logf("grpc flood of the control socket as nobody: %+v", rep)
	w.served(t, 8)
	if rep.Held != perUID || rep.Refused == 0 {
		t.Errorf("nobody held %d connections to the control socket, want its bound of %d and the rest refused", rep.Held, perUID)
	}
	if v := metricValue(scrapeMetrics(t, r.d), "phasegate_conns_refused_total", "surface", "socket", "reason", "per_peer"); v <= 0 {
		t.Errorf("phasegate_conns_refused_total{socket, per_peer} = %v", v)
	}
	r.finish()
}

// An open files limit too low for the daemon's own work and a port stops
// the start with exit 2 and one line saying what to raise, before
// anything is made.
func TestOpenFilesLimitTooLowExitsTwo(t *testing.T) {
	h := newHost(t)
	cmd := exec.Command("prlimit", append([]string{"--nofile=256", "--", binary}, h.args(freePort(t))...)...)
	d := &daemon{Process: startCmd(t, cmd), t: t}
	if code := d.wait(20 * time.Second); code != 2 {
		t.Fatalf("exit %d, want 2; output:\n%s", code, d.Output())
	}
	out := lines(d.Output())
	if len(out) != 1 || !strings.Contains(out[0], "the open files limit 256") || !strings.Contains(out[0], "raise the limit") {
		t.Fatalf("output %q, want one line naming the limit and what to do", out)
	}
	for _, dir := range []string{h.stateDir, h.netnsDir} {
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("%s was created", dir)
		}
	}
}
