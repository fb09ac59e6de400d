package test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

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
