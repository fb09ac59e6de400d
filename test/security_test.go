package test

import (
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/status"

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
	before := observeVictim(t, root, vi)
	if before.slot.GetPrincipal() != "uid:0" {
		t.Fatalf("the victim's lease names principal %q, want uid:0", before.slot.GetPrincipal())
	}
	stopHealth := watchHealth(t, d)

	attackTheVictimsLease(t, pub, d, sock, addr, victim)
	before.same(t, observeVictim(t, root, vi), "the attacks of nobody and daemon")
	floodAsNobody(t, ctx, pub, root, sock)
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
	checkVictimAfterTheAttacks(t, d, h, sock, victim)
	h.decommission(h.prefix)
}

// attackTheVictimsLease attacks root's lease as daemon (outside the
// socket's group, then in it with no grant) and as nobody (granted
// tenant-b-* only), over the control socket and the TCP port: each call
// is refused with its code, and nobody's list shows nothing of the
// victim's.
func attackTheVictimsLease(t *testing.T, pub *publicDir, d *daemon, sock, addr string, victim *phasegatev1.AcquireResponse) {
	t.Helper()
	idx := fmt.Sprint(victim.GetSlot().GetIndex())
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
}

// floodAsNobody exhausts the daemon as nobody: 70 Acquires on a daemon of
// 64 slots (its quota of 3 holds, and root's next Acquire is served), then
// a flood of reads, which the rate limit answers.
func floodAsNobody(t *testing.T, ctx context.Context, pub *publicDir, root phasegatev1.SlotsClient, sock string) {
	t.Helper()
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
}

// checkVictimAfterTheAttacks checks what the stopped daemon left: no
// control socket, no lease id in its log, the audit line of nobody's
// refused Release, and the victim's record as root made it.
func checkVictimAfterTheAttacks(t *testing.T, d *daemon, h *host, sock string, victim *phasegatev1.AcquireResponse) {
	t.Helper()
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
	rec, ok, err := st.Get(int(victim.GetSlot().GetIndex()))
	st.Close()
	if err != nil || !ok || rec.LeaseID != victim.GetLeaseId() || rec.Principal != "uid:0" || rec.Owner != "victim" || rec.RequestID != "sandbox-abc" {
		t.Fatalf("the victim's record after the attacks: %+v %v %v", rec, ok, err)
	}
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

// mtlsKeys are TestControlOverMutualTLS's certificates, all readable by
// the attacker: the daemon's CA (certs) and the orchestrator's identity
// it grants (orch), and the client certificates tried.
type mtlsKeys struct {
	certs                                       *testcerts.Set
	orch                                        *url.URL
	good, foreign, expired, anonymous, stranger clientCert
}

// newMTLSKeys issues, into pub's directory, the orchestrator's
// certificate, one of another CA, an expired one, one that names nobody,
// and takes the CA's own client certificate as one the policy does not
// know.
func newMTLSKeys(t *testing.T, pub *publicDir) mtlsKeys {
	t.Helper()
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
	return mtlsKeys{certs: certs, orch: orch, good: good, foreign: foreign, expired: expired, anonymous: anonymous, stranger: stranger}
}

// Over TCP the control surface exists only with mutual TLS: a certificate
// of another CA, an expired one and one that names nobody are refused, one
// whose identity the policy does not know may do nothing, and the one it
// grants leases for its owners.
func TestControlOverMutualTLS(t *testing.T) {
	pub := newPublicDir(t)
	k := newMTLSKeys(t, pub)
	certs, orch := k.certs, k.orch
	good, foreign, expired, anonymous, stranger := k.good, k.foreign, k.expired, k.anonymous, k.stranger

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
