package test

import (
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
	"github.com/phasegate/phasegate/internal/testcerts"
	"github.com/phasegate/phasegate/network/leases"
)

// The attacks of docs/RELIABILITY.md ("The control plane"), run as the
// unprivileged users a host has: nobody (uid 65534, group nogroup), which
// the policy lets lease for tenant-b-* owners, and daemon (uid 1), which
// it grants nothing. Each is refused with its code, and the victim — a
// lease root holds — is untouched: the same record, the same namespace by
// inode, the same host link, while health answers 200 throughout.

// floodEnv makes this test binary, run as another user, a client that
// floods a control socket: "SOCKET|METHOD|N" (METHOD list or acquire).
const floodEnv = "PHASEGATE_TEST_FLOOD"

func init() {
	if v := os.Getenv(floodEnv); v != "" {
		os.Exit(flood(v))
	}
}

// flood makes N calls on the socket from 8 goroutines and prints how many
// ended with each code, as JSON.
func flood(spec string) int {
	parts := strings.Split(spec, "|")
	if len(parts) != 3 {
		fmt.Fprintf(os.Stderr, "%s=%q: want SOCKET|METHOD|N\n", floodEnv, spec)
		return 2
	}
	var n int
	fmt.Sscan(parts[2], &n)
	conn, err := grpc.NewClient("unix://"+parts[0], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer conn.Close()
	c := phasegatev1.NewSlotsClient(conn)
	var (
		mu     sync.Mutex
		counts = map[string]int{}
		next   atomic.Int64
		wg     sync.WaitGroup
	)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for range 8 {
		wg.Go(func() {
			for i := next.Add(1); i <= int64(n); i = next.Add(1) {
				var err error
				if parts[1] == "acquire" {
					_, err = c.Acquire(ctx, &phasegatev1.AcquireRequest{Owner: fmt.Sprintf("tenant-b-flood-%d", i)})
				} else {
					_, err = c.List(ctx, &phasegatev1.ListRequest{})
				}
				mu.Lock()
				counts[status.Code(err).String()]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	b, _ := json.Marshal(counts)
	fmt.Println(string(b))
	return 0
}

// publicDir is a directory every user may reach, holding a copy of the
// binary every user may run (the build's own directory is root's) and
// whatever else an unprivileged attacker must read.
type publicDir struct {
	dir, binary, testBinary string
}

func newPublicDir(t *testing.T) *publicDir {
	t.Helper()
	dir, err := os.MkdirTemp("", "phasegate-sec-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	p := &publicDir{dir: dir, binary: filepath.Join(dir, "phasegate"), testBinary: filepath.Join(dir, "test.test")}
	copyFile(t, binary, p.binary, 0o755)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	copyFile(t, self, p.testBinary, 0o755)
	return p
}

func copyFile(t *testing.T, from, to string, mode os.FileMode) {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(to, mode); err != nil {
		t.Fatal(err)
	}
}

// as runs phasegate as user (in group, when set) and returns its output
// and exit code.
func (p *publicDir) as(t *testing.T, user, group string, args ...string) (string, int) {
	t.Helper()
	ra := []string{"-u", user}
	if group != "" {
		ra = append(ra, "-g", group)
	}
	cmd := exec.Command("runuser", append(append(ra, "--", p.binary), args...)...)
	cmd.Dir = p.dir
	out, err := cmd.CombinedOutput()
	code := exitCode(err)
	if code < 0 {
		t.Fatalf("runuser %v: %v", args, err)
	}
	return string(out), code
}

// victimState is what an attack must leave as it was: the lease as root
// sees it, and the kernel's identity of its namespace and host link.
type victimState struct {
	slot    *phasegatev1.Slot
	netnsID uint64
	ifindex int
}

func observeVictim(t *testing.T, c phasegatev1.SlotsClient, i uint32) victimState {
	t.Helper()
	return observeVictimIn(t, nil, c, i)
}

// observeVictimIn is observeVictim for a daemon that runs in node n (nil:
// here), where its slots' host links are.
func observeVictimIn(t *testing.T, n *node, c phasegatev1.SlotsClient, i uint32) victimState {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := c.Get(ctx, &phasegatev1.GetRequest{Index: i})
	if err != nil {
		t.Fatalf("Get(%d) as root: %v", i, err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(resp.GetSlot().GetNetnsPath(), &st); err != nil {
		t.Fatalf("the victim's namespace: %v", err)
	}
	var ifc *net.Interface
	lookup := func() (err error) {
		ifc, err = net.InterfaceByName(resp.GetSlot().GetHostInterface())
		return err
	}
	if n != nil {
		err = n.inNamespace(lookup)
	} else {
		err = lookup()
	}
	if err != nil {
		t.Fatalf("the victim's host link: %v", err)
	}
	// What the victim's own policy dropped is its traffic, not its
	// state: a late segment of the probe's connection closed under load
	// (conntrack no longer sees it as established) is dropped and counted
	// without anything having touched the lease.
	sl := resp.GetSlot()
	sl.EgressDroppedPackets = 0
	return victimState{slot: sl, netnsID: st.Ino, ifindex: ifc.Index}
}

func (v victimState) same(t *testing.T, after victimState, what string) {
	t.Helper()
	if !proto.Equal(v.slot, after.slot) || v.netnsID != after.netnsID || v.ifindex != after.ifindex {
		t.Fatalf("after %s the victim changed:\nbefore %v netns inode %d ifindex %d\nafter  %v netns inode %d ifindex %d",
			what, v.slot, v.netnsID, v.ifindex, after.slot, after.netnsID, after.ifindex)
	}
}

// watchHealth polls /readyz until stopped and returns how many polls
// answered something else than 200.
func watchHealth(t *testing.T, d *daemon) (stop func() (polls, failed int)) {
	var polls, failed atomic.Int64
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			case <-time.After(20 * time.Millisecond):
			}
			code, _, err := d.get("/readyz")
			polls.Add(1)
			if err != nil || code != http.StatusOK {
				failed.Add(1)
			}
		}
	})
	return func() (int, int) {
		close(done)
		wg.Wait()
		return int(polls.Load()), int(failed.Load())
	}
}

// wantRefused checks a CLI call failed with code in its one-line error.
func wantRefused(t *testing.T, what, out string, exit int, code string) {
	t.Helper()
	if exit != 1 || !strings.Contains(out, ": "+code+": ") {
		t.Errorf("%s: exit %d %q, want exit 1 and %s", what, exit, strings.TrimSpace(out), code)
	}
}

func TestControlPlaneAttacks(t *testing.T) {
	pub := newPublicDir(t)
	h := newHost(t)
	addr := freePort(t)
	sock := filepath.Join(pub.dir, "control.sock")
	args := h.args(addr, "--slots=64", "--control-socket="+sock, "--control-group=nogroup",
		"--allow=uid:65534=tenant-b-*", "--max-leases=3", "--control-rate=20")
	d := start(t, nil, args...)
	d.waitServing(time.Minute)
	root := d.slots()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	victim, err := root.Acquire(ctx, &phasegatev1.AcquireRequest{Owner: "victim", RequestId: "sandbox-abc"})
	if err != nil {
		t.Fatal(err)
	}
	vi := victim.GetSlot().GetIndex()
	idx := fmt.Sprint(vi)
	before := observeVictim(t, root, vi)
	if before.slot.GetPrincipal() != "uid:0" {
		t.Fatalf("the victim's lease names principal %q, want uid:0", before.slot.GetPrincipal())
	}
	stopHealth := watchHealth(t, d)
	S := "--socket=" + sock

	// Not in the socket's group: the kernel refuses the connection.
	out, code := pub.as(t, "daemon", "", "slots", "list", S)
	if code != 1 || !strings.Contains(out, "permission denied") {
		t.Errorf("connect as daemon (not in nogroup): exit %d %q, want permission denied", code, out)
	}
	// In the group, but granted nothing: every connection closed at
	// accept, before any call is read.
	for _, call := range [][]string{
		{"list"}, {"get", idx}, {"acquire", "victim", "--request-id=sandbox-abc"},
		{"release", idx, victim.GetLeaseId()}, {"keepalive", idx, victim.GetLeaseId()},
	} {
		out, code := pub.as(t, "daemon", "nogroup", append(append([]string{"slots"}, call...), S)...)
		wantRefused(t, "as daemon in nogroup: "+call[0], out, code, "Unavailable")
	}
	// nobody may lease for tenant-b-*: nothing of the victim's.
	out, code = pub.as(t, "nobody", "", "slots", "list", "--all", S)
	if code != 0 || strings.Contains(out, "victim") || strings.Contains(out, "sandbox-abc") {
		t.Errorf("list as nobody: exit %d, shows the victim's lease:\n%s", code, out)
	}
	for _, tc := range []struct {
		what string
		args []string
		code string
	}{
		{"get the victim's slot", []string{"get", idx}, "PermissionDenied"},
		{"replay the victim's acquire", []string{"acquire", "victim", "--request-id=sandbox-abc"}, "PermissionDenied"},
		{"release with the victim's lease id", []string{"release", idx, victim.GetLeaseId()}, "PermissionDenied"},
		{"release with a guessed lease id", []string{"release", idx, leases.NewLeaseID()}, "PermissionDenied"},
		{"keepalive with the victim's lease id", []string{"keepalive", idx, victim.GetLeaseId()}, "PermissionDenied"},
		{"TCP without a client certificate", []string{"list", "--addr=" + addr}, "Unauthenticated"},
		{"acquire over TCP", []string{"acquire", "tenant-b-1", "--addr=" + addr}, "Unauthenticated"},
	} {
		out, code := pub.as(t, "nobody", "", append(append([]string{"slots"}, tc.args...), S)...)
		wantRefused(t, "as nobody: "+tc.what, out, code, tc.code)
	}
	if code, body, err := d.get("/debug/slots"); err != nil || code != http.StatusNotFound || strings.Contains(body, "victim") {
		t.Errorf("/debug/slots on the port: %d %v %q, want 404: tenants are named only on the control surface", code, err, body)
	}
	before.same(t, observeVictim(t, root, vi), "the attacks of nobody and daemon")

	// Exhaustion: 70 Acquires as nobody on a daemon of 64 slots. Its quota
	// of 3 holds, and root's next Acquire is served.
	res := pub.flood(t, "nobody", sock, "acquire", 70)
	t.Logf("70 Acquires as nobody (quota 3, 20 calls/s): %v", res)
	if res["OK"] != 3 || res["ResourceExhausted"] != 67 {
		t.Errorf("70 Acquires as nobody with a quota of 3: %v, want 3 OK and 67 ResourceExhausted", res)
	}
	if _, err := root.Acquire(ctx, &phasegatev1.AcquireRequest{Owner: "legit", RequestId: "after-exhaustion"}); err != nil {
		t.Errorf("root's Acquire after nobody's flood: %v", err)
	}
	// A flood of reads: the rate limit answers it, health does not notice.
	floodAt := time.Now()
	res = pub.flood(t, "nobody", sock, "list", 500)
	t.Logf("500 Lists as nobody in %v: %v", time.Since(floodAt).Round(time.Millisecond), res)
	if res["ResourceExhausted"] == 0 || res["OK"]+res["ResourceExhausted"] != 500 {
		t.Errorf("500 Lists as nobody at 20 calls/s: %v, want OK or ResourceExhausted, many of them ResourceExhausted", res)
	}
	polls, failed := stopHealth()
	t.Logf("health during the attacks: %d polls of /readyz, %d not 200", polls, failed)
	if polls == 0 || failed != 0 {
		t.Errorf("health during the attacks: %d of %d polls not 200", failed, polls)
	}
	before.same(t, observeVictim(t, root, vi), "the floods")

	// The victim's owner keeps working: renew, and its records survive the
	// stop unchanged.
	if _, err := root.KeepAlive(ctx, &phasegatev1.KeepAliveRequest{Index: vi, LeaseId: victim.GetLeaseId()}); err != nil {
		t.Errorf("root's KeepAlive of the victim: %v", err)
	}
	d.signal(syscall.SIGTERM)
	if code := d.wait(time.Minute); code != 0 {
		t.Fatalf("stop: exit %d", code)
	}
	if _, err := os.Lstat(sock); !os.IsNotExist(err) {
		t.Errorf("the control socket is left after an orderly stop: %v", err)
	}
	// A lease id is a capability: never in the log, even at debug level.
	if logs := d.Output(); strings.Contains(logs, victim.GetLeaseId()) || strings.Contains(logs, victim.GetLeaseId()[:16]) {
		t.Error("the victim's lease id is in the daemon's log")
	}
	if !strings.Contains(d.Output(), `msg="control call refused" audit=true method=Release surface=socket principal=uid:65534`) {
		t.Error("no audit line of nobody's refused Release")
	}
	st, err := leases.Open(filepath.Join(h.stateDir, "slots.db"), leases.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rec, ok, err := st.Get(int(vi))
	st.Close()
	if err != nil || !ok || rec.LeaseID != victim.GetLeaseId() || rec.Principal != "uid:0" || rec.Owner != "victim" || rec.RequestID != "sandbox-abc" {
		t.Fatalf("the victim's record after the attacks: %+v %v %v", rec, ok, err)
	}
	h.decommission(h.prefix)
}

// flood runs the flood client as user against sock.
func (p *publicDir) flood(t *testing.T, user, sock, method string, n int) map[string]int {
	t.Helper()
	cmd := exec.Command("runuser", "-u", user, "--", p.testBinary)
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s|%s|%d", floodEnv, sock, method, n))
	cmd.Dir = p.dir
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("flood as %s: %v %s", user, err, out)
	}
	res := map[string]int{}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("flood as %s: %q: %v", user, out, err)
	}
	return res
}

// A principal within its policy leases, renews, lists its own, retries
// across a restart and gets the same lease, and releases; the lease
// restored after the restart keeps its principal.
func TestControlPrincipalAcrossRestart(t *testing.T) {
	pub := newPublicDir(t)
	h := newHost(t)
	addr := freePort(t)
	sock := filepath.Join(pub.dir, "control.sock")
	args := h.args(addr, "--slots=64", "--control-socket="+sock, "--control-group=nogroup", "--allow=uid:65534=tenant-b-*")
	d := start(t, nil, args...)
	d.waitServing(time.Minute)
	S := "--socket=" + sock
	acquire := func() (idx uint32, leaseID string) {
		t.Helper()
		out, code := pub.as(t, "nobody", "", "slots", "acquire", "tenant-b-7", "--request-id=job-7", "--ttl=10m", S)
		if code != 0 {
			t.Fatalf("acquire as nobody: exit %d %s", code, out)
		}
		var r struct {
			Slot struct {
				Index     uint32 `json:"index"`
				Principal string `json:"principal"`
			} `json:"slot"`
			LeaseID string `json:"lease_id"`
		}
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("acquire output %q: %v", out, err)
		}
		if r.Slot.Principal != "uid:65534" {
			t.Fatalf("the lease names principal %q, want uid:65534", r.Slot.Principal)
		}
		return r.Slot.Index, r.LeaseID
	}
	i, lease := acquire()
	if out, code := pub.as(t, "nobody", "", "slots", "keepalive", fmt.Sprint(i), lease, S); code != 0 {
		t.Fatalf("keepalive as nobody: exit %d %s", code, out)
	}
	if out, code := pub.as(t, "nobody", "", "slots", "list", S); code != 0 || !strings.Contains(out, "tenant-b-7") {
		t.Fatalf("list as nobody: exit %d, its own lease missing:\n%s", code, out)
	}

	d.signal(syscall.SIGTERM)
	if code := d.wait(time.Minute); code != 0 {
		t.Fatalf("stop: exit %d", code)
	}
	d = start(t, nil, args...)
	d.waitServing(time.Minute)
	if i2, lease2 := acquire(); i2 != i || lease2 != lease {
		t.Fatalf("the retry across the restart: slot %d lease %.8s…, want slot %d lease %.8s…", i2, lease2, i, lease)
	}
	// Another principal the policy lets act for the owner may not take the
	// lease by replaying the request.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := d.slots().Acquire(ctx, &phasegatev1.AcquireRequest{Owner: "tenant-b-7", RequestId: "job-7"})
	if got := status.Code(err).String(); got != "AlreadyExists" {
		t.Fatalf("root's replay of nobody's request: %v, want AlreadyExists", err)
	}
	if out, code := pub.as(t, "nobody", "", "slots", "release", fmt.Sprint(i), lease, S); code != 0 {
		t.Fatalf("release as nobody: exit %d %s", code, out)
	}
	d.signal(syscall.SIGTERM)
	if code := d.wait(time.Minute); code != 0 {
		t.Fatalf("stop: exit %d", code)
	}
	h.decommission(h.prefix)
}

// Over TCP the control surface exists only with mutual TLS: a certificate
// of another CA, an expired one and one that names nobody are refused, one
// whose identity the policy does not know may do nothing, and the one it
// grants leases for its owners.
func TestControlOverMutualTLS(t *testing.T) {
	pub := newPublicDir(t)
	certs, err := testcerts.New()
	if err != nil {
		t.Fatal(err)
	}
	if err := certs.WriteFiles(pub.dir); err != nil {
		t.Fatal(err)
	}
	other, err := testcerts.New()
	if err != nil {
		t.Fatal(err)
	}
	otherDir := filepath.Join(pub.dir, "other")
	if err := os.Mkdir(otherDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := other.WriteFiles(otherDir); err != nil {
		t.Fatal(err)
	}
	orch, _ := url.Parse("spiffe://phasegate.test/ns/sandbox/sa/orchestrator")
	issue := func(ca *testcerts.Set, name string, tmpl *x509.Certificate) (cert, key string) {
		t.Helper()
		_, cert, key, err := ca.Issue(pub.dir, name, tmpl)
		if err != nil {
			t.Fatal(err)
		}
		return cert, key
	}
	type clientCert struct{ cert, key string }
	good := func() clientCert {
		c, k := issue(certs, "orchestrator", &x509.Certificate{URIs: []*url.URL{orch}})
		return clientCert{c, k}
	}()
	foreign := func() clientCert {
		c, k := issue(other, "foreign", &x509.Certificate{URIs: []*url.URL{orch}})
		return clientCert{c, k}
	}()
	expired := func() clientCert {
		c, k := issue(certs, "expired", &x509.Certificate{URIs: []*url.URL{orch},
			NotBefore: time.Now().Add(-2 * time.Hour), NotAfter: time.Now().Add(-time.Hour)})
		return clientCert{c, k}
	}()
	anonymous := func() clientCert {
		c, k := issue(certs, "anonymous", &x509.Certificate{Subject: pkix.Name{}})
		return clientCert{c, k}
	}()
	stranger := clientCert{certs.ClientCert, certs.ClientKey} // CN sandbox-scheduler: no rule
	// The attacker must read its own certificates.
	entries, _ := os.ReadDir(pub.dir)
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".pem") {
			_ = os.Chmod(filepath.Join(pub.dir, e.Name()), 0o644)
		}
	}
	for _, n := range []string{"ca.pem", "client.pem", "client-key.pem"} {
		_ = os.Chmod(filepath.Join(otherDir, n), 0o644)
	}

	h := newHost(t)
	addr := freePort(t)
	d := start(t, nil, h.args(addr, "--slots=64", "--tls-cert="+certs.ServerCert, "--tls-key="+certs.ServerKey,
		"--tls-client-ca="+certs.CAFile, "--allow=id:"+orch.String()+"=tenant-*")...)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	root := d.slots()
	waitFor(t, time.Minute, "the daemon to serve on its control socket", func() bool {
		_, err := root.List(ctx, &phasegatev1.ListRequest{})
		return err == nil
	})
	victim, err := root.Acquire(ctx, &phasegatev1.AcquireRequest{Owner: "victim", RequestId: "sandbox-abc"})
	if err != nil {
		t.Fatal(err)
	}
	before := observeVictim(t, root, victim.GetSlot().GetIndex())

	tlsArgs := func(c clientCert) []string {
		return []string{"--addr=" + addr, "--tls-ca=" + certs.CAFile, "--tls-cert=" + c.cert, "--tls-key=" + c.key}
	}
	for _, tc := range []struct {
		what string
		cert clientCert
		code string
	}{
		// The handshake fails: the connection never carries a call.
		{"a certificate of another CA", foreign, "Unavailable"},
		{"an expired certificate", expired, "Unavailable"},
		{"a certificate without an identity", anonymous, "Unauthenticated"},
		{"a certificate the policy does not know", stranger, "PermissionDenied"},
	} {
		out, code := pub.as(t, "nobody", "", append([]string{"slots", "release", fmt.Sprint(victim.GetSlot().GetIndex()), victim.GetLeaseId()}, tlsArgs(tc.cert)...)...)
		wantRefused(t, tc.what, out, code, tc.code)
	}
	out, code := pub.as(t, "nobody", "", append([]string{"slots", "acquire", "tenant-ci-1", "--request-id=ci-1"}, tlsArgs(good)...)...)
	var acq struct {
		Slot struct {
			Principal string `json:"principal"`
		} `json:"slot"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &acq) != nil || acq.Slot.Principal != "x509:uri:"+orch.String() {
		t.Fatalf("acquire with the orchestrator's certificate: exit %d %s, want principal x509:uri:%s", code, out, orch)
	}
	out, code = pub.as(t, "nobody", "", append([]string{"slots", "acquire", "victim", "--request-id=sandbox-abc"}, tlsArgs(good)...)...)
	wantRefused(t, "the orchestrator's certificate replaying root's request for an owner it is not granted", out, code, "PermissionDenied")
	before.same(t, observeVictim(t, root, victim.GetSlot().GetIndex()), "the certificate attacks")
	d.signal(syscall.SIGTERM)
	if code := d.wait(time.Minute); code != 0 {
		t.Fatalf("stop: exit %d", code)
	}
	h.decommission(h.prefix)
}

// Bad input on the control surface stops the start with exit 2 and one
// line, before anything is created, and leaves the path as it was.
func TestControlBadInputExitsTwoAndTouchesNothing(t *testing.T) {
	dir := t.TempDir()
	link := filepath.Join(dir, "link.sock")
	if err := os.Symlink(filepath.Join(dir, "elsewhere"), link); err != nil {
		t.Fatal(err)
	}
	live := filepath.Join(dir, "live.sock")
	l, err := net.Listen("unix", live)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	policy := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"socket path is a file", []string{"--control-socket=/etc/hostname"}, "/etc/hostname exists and is not a socket"},
		{"socket path is a directory", []string{"--control-socket=" + dir}, "is a directory"},
		{"socket path is a symlink", []string{"--control-socket=" + link}, "is a symlink"},
		{"socket held by a live process", []string{"--control-socket=" + live}, "a live process answers on it"},
		{"relative socket path", []string{"--control-socket=control.sock"}, "must be an absolute path"},
		{"socket in a missing directory", []string{"--control-socket=/nonexistent-phasegate/control.sock"}, "does not exist"},
		{"unknown group", []string{"--control-group=no-such-group-phasegate"}, `group "no-such-group-phasegate"`},
		{"policy that does not parse", []string{"--control-policy=" + policy("bad.json", "{")}, "bad.json"},
		{"policy with an unknown field", []string{"--control-policy=" + policy("field.json", `{"principals": [{"uid": 1, "owners": ["*"], "ownres": []}]}`)}, `unknown field "ownres"`},
		{"policy naming an unknown user", []string{"--control-policy=" + policy("user.json", `{"principals": [{"user": "no-such-user-phasegate", "owners": ["*"]}]}`)}, "no-such-user-phasegate"},
		{"missing policy file", []string{"--control-policy=/nonexistent-phasegate/policy.json"}, "no such file"},
		{"rule without owners", []string{"--allow=uid:1000"}, "want SELECTOR=OWNER"},
		{"rule with an unknown selector", []string{"--allow=pid:1=*"}, "unknown selector"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHost(t)
			var before os.FileInfo
			for _, a := range tc.args {
				if p, ok := strings.CutPrefix(a, "--control-socket="); ok && filepath.IsAbs(p) {
					before, _ = os.Lstat(p)
				}
			}
			d := start(t, nil, append(h.args(freePort(t)), tc.args...)...)
			if code := d.wait(20 * time.Second); code != 2 {
				t.Fatalf("exit %d, want 2; output:\n%s", code, d.Output())
			}
			out := lines(d.Output())
			if len(out) != 1 || !strings.Contains(out[0], tc.want) {
				t.Fatalf("output %q, want one line containing %q", out, tc.want)
			}
			for _, dir := range []string{h.stateDir, h.netnsDir} {
				if _, err := os.Stat(dir); !os.IsNotExist(err) {
					t.Errorf("%s was created", dir)
				}
			}
			for _, a := range tc.args {
				if p, ok := strings.CutPrefix(a, "--control-socket="); ok && before != nil {
					if after, err := os.Lstat(p); err != nil || !os.SameFile(before, after) || after.Mode() != before.Mode() {
						t.Errorf("%s changed: %v", p, err)
					}
				}
			}
		})
	}
	// The live socket still answers its owner.
	c, err := net.Dial("unix", live)
	if err != nil {
		t.Fatalf("the live socket after the attempts: %v", err)
	}
	c.Close()
}
