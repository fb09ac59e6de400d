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
	"net/http/httptrace"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
	"github.com/phasegate/phasegate/internal/testcerts"
	"github.com/phasegate/phasegate/network/leases"
)

// The attacks on principals, the policy file, rates and TTLs
// (docs/SECURITY.md): certificate identities of one kind passed off as
// another, policy files that smuggle rights, limits that are no limits,
// and a route outside the rate.

// debugFloodEnv makes this test binary, run as another user, a client
// that floods /debug/slots on a control socket: "SOCKET|N". It prints how
// many answers had each status (a 429 without Retry-After counted apart),
// how many connections it dialed and how long the flood took, as JSON.
const debugFloodEnv = "PHASEGATE_TEST_DEBUG_FLOOD"

func init() {
	if v := os.Getenv(debugFloodEnv); v != "" {
		os.Exit(floodDebugSlots(v))
	}
}

// unixHTTP is an HTTP client of the control socket at sock.
func unixHTTP(sock string) *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		}}}
}

func floodDebugSlots(spec string) int {
	sock, ns, ok := strings.Cut(spec, "|")
	n, err := strconv.Atoi(ns)
	if !ok || err != nil {
		fmt.Fprintf(os.Stderr, "%s=%q: want SOCKET|N\n", debugFloodEnv, spec)
		return 2
	}
	c := unixHTTP(sock)
	// Eight callers on eight kept connections: a client that dialed anew
	// for each request (the transport keeps 2 idle by default, and drops
	// a connection whose answer was not read to its end) would meet the
	// socket's bound of 16 connections a uid while the server still
	// closes the last ones, which is another test's (security_flood_test.go).
	tr := c.Transport.(*http.Transport)
	tr.MaxIdleConnsPerHost, tr.MaxConnsPerHost = 8, 8
	var (
		mu     sync.Mutex
		counts = map[string]int{}
		next   atomic.Int64
		wg     sync.WaitGroup
	)
	start := time.Now()
	for range 8 {
		wg.Go(func() {
			for i := next.Add(1); i <= int64(n); i = next.Add(1) {
				key := "error"
				trace := &httptrace.ClientTrace{GotConn: func(ci httptrace.GotConnInfo) {
					if !ci.Reused {
						mu.Lock()
						counts["dialed"]++
						mu.Unlock()
					}
				}}
				req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), http.MethodGet, "http://control/debug/slots", nil)
				if resp, err := c.Do(req); err == nil {
					_, _ = io.Copy(io.Discard, resp.Body) // read to its end: the connection is kept
					resp.Body.Close()
					key = strconv.Itoa(resp.StatusCode)
					if resp.StatusCode == http.StatusTooManyRequests && resp.Header.Get("Retry-After") == "" {
						key += " without Retry-After"
					}
				}
				mu.Lock()
				counts[key]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	counts["ms"] = int(time.Since(start).Milliseconds())
	b, _ := json.Marshal(counts)
	fmt.Println(string(b))
	return 0
}

// builderID is the SPIFFE ID of TestCertificateIdentitiesDoNotCollide's
// builder.
const builderID = "spiffe://x/ns/ci/sa/builder"

// clientCert is a client certificate's and its key's files.
type clientCert struct{ cert, key string }

// impostor is a certificate whose identity of kind is builderID's string.
type impostor struct {
	kind string
	cert clientCert
}

// builderCertificates writes a CA and a server certificate into pub, and
// client certificates every user may read: the builder's, with builderID
// as its URI SAN, and the impostors', with it as their common name and as
// their DNS SAN.
func builderCertificates(t *testing.T, pub *publicDir) (*testcerts.Set, clientCert, []impostor) {
	t.Helper()
	certs, err := testcerts.New()
	if err != nil {
		t.Fatal(err)
	}
	if err := certs.WriteFiles(pub.dir); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(certs.CAFile, 0o644); err != nil {
		t.Fatal(err)
	}
	issue := func(name string, tmpl *x509.Certificate) clientCert {
		t.Helper()
		_, cert, key, err := certs.Issue(pub.dir, name, tmpl)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{cert, key} {
			if err := os.Chmod(f, 0o644); err != nil { // read by nobody
				t.Fatal(err)
			}
		}
		return clientCert{cert, key}
	}
	u, err := url.Parse(builderID)
	if err != nil {
		t.Fatal(err)
	}
	return certs, issue("builder", &x509.Certificate{URIs: []*url.URL{u}}), []impostor{
		{"cn", issue("cn-impostor", &x509.Certificate{Subject: pkix.Name{CommonName: builderID}})},
		{"dns", issue("dns-impostor", &x509.Certificate{DNSNames: []string{builderID}})},
	}
}

// A certificate whose common name, and one whose DNS SAN, is the string of
// the builder's SPIFFE ID is another principal than the builder's URI SAN:
// each, granted owners of its own so that the service and not the guard
// decides, can neither retry the builder's request, nor renew or release
// its lease with its leaked lease id. The builder's record, namespace and
// host link are unchanged; the audit lines tell the three apart.
func TestCertificateIdentitiesDoNotCollide(t *testing.T) {
	pub := newPublicDir(t)
	certs, builder, impostors := builderCertificates(t, pub)
	h := newHost(t)
	addr := freePort(t)
	d := start(t, nil, h.args(addr, "--slots=64", "--tls-cert="+certs.ServerCert, "--tls-key="+certs.ServerKey,
		"--tls-client-ca="+certs.CAFile, "--allow=id:"+builderID+"=ci-*",
		"--allow=id:cn:"+builderID+"=other-*", "--allow=id:dns:"+builderID+"=other-*")...)
	root := d.slots()
	waitFor(t, time.Minute, "the daemon to serve on its control socket", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := root.List(ctx, &phasegatev1.ListRequest{})
		return err == nil
	})
	tlsArgs := func(c clientCert) []string {
		return []string{"--addr=" + addr, "--tls-ca=" + certs.CAFile, "--tls-cert=" + c.cert, "--tls-key=" + c.key}
	}
	slotsAs := func(c clientCert, args ...string) (string, int) {
		return pub.as(t, "nobody", "", append(append([]string{"slots"}, args...), tlsArgs(c)...)...)
	}
	out, code := slotsAs(builder, "acquire", "ci-build", "--request-id=build-1", "--ttl=10m")
	var victim struct {
		Slot struct {
			Index     uint32 `json:"index"`
			Principal string `json:"principal"`
		} `json:"slot"`
		LeaseID string `json:"lease_id"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &victim) != nil || victim.Slot.Principal != "x509:uri:"+builderID {
		t.Fatalf("the builder's acquire: exit %d %s, want a lease of principal x509:uri:%s", code, out, builderID)
	}
	vi, idx := victim.Slot.Index, fmt.Sprint(victim.Slot.Index)
	before := observeVictim(t, root, vi)

	for _, imp := range impostors {
		who := "the " + imp.kind + " impostor"
		// Its own grant works: it is a principal, only not the builder.
		out, code := slotsAs(imp.cert, "acquire", "other-"+imp.kind)
		var own struct {
			Slot struct {
				Principal string `json:"principal"`
			} `json:"slot"`
		}
		if code != 0 || json.Unmarshal([]byte(out), &own) != nil || own.Slot.Principal != "x509:"+imp.kind+":"+builderID {
			t.Errorf("%s's acquire of its own owner: exit %d %s, want principal x509:%s:%s", who, code, out, imp.kind, builderID)
		}
		for _, tc := range []struct {
			what string
			args []string
		}{
			{"retries the builder's request", []string{"acquire", "ci-build", "--request-id=build-1", "--ttl=10m"}},
			{"renews the builder's lease with its lease id", []string{"keepalive", idx, victim.LeaseID}},
			{"releases the builder's lease with its lease id", []string{"release", idx, victim.LeaseID}},
		} {
			out, code := slotsAs(imp.cert, tc.args...)
			wantRefused(t, who+" "+tc.what, out, code, "PermissionDenied")
			if strings.Contains(out, victim.LeaseID) {
				t.Errorf("%s %s: its answer holds the builder's lease id", who, tc.what)
			}
		}
	}
	before.same(t, observeVictim(t, root, vi), "the impostors' attempts")
	// The builder itself renews.
	if out, code := slotsAs(builder, "keepalive", idx, victim.LeaseID); code != 0 {
		t.Errorf("the builder's keepalive: exit %d %s", code, out)
	}

	d.signal(syscall.SIGTERM)
	if code := d.wait(time.Minute); code != 0 {
		t.Fatalf("stop: exit %d", code)
	}
	checkAuditAndRecord(t, d, h, vi, victim.LeaseID)
	h.decommission(h.prefix)
}

// checkAuditAndRecord checks, once the daemon of
// TestCertificateIdentitiesDoNotCollide stopped, that its audit lines
// name each kind of principal, and that the builder's record is its own.
func checkAuditAndRecord(t *testing.T, d *daemon, h *host, vi uint32, leaseID string) {
	t.Helper()
	logs := d.Output()
	for _, want := range []string{
		`msg="control call" audit=true method=Acquire surface=tcp principal=x509:uri:` + builderID + ` owner=ci-build`,
		`msg="control call refused" audit=true method=Release surface=tcp principal=x509:cn:` + builderID,
		`msg="control call refused" audit=true method=Release surface=tcp principal=x509:dns:` + builderID,
		`msg="control call refused" audit=true method=Acquire surface=tcp principal=x509:dns:` + builderID + ` owner=ci-build request_id=build-1`,
	} {
		if !strings.Contains(logs, want) {
			t.Errorf("no audit line %q", want)
		}
	}
	st, err := leases.Open(filepath.Join(h.stateDir, "slots.db"), leases.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rec, ok, err := st.Get(int(vi))
	st.Close()
	if err != nil || !ok || rec.LeaseID != leaseID || rec.Principal != "x509:uri:"+builderID || rec.Owner != "ci-build" || rec.RequestID != "build-1" {
		t.Fatalf("the builder's record after the attempts: %+v %v %v", rec, ok, err)
	}
}

// Each policy file that would smuggle rights, and each file someone other
// than root controls, stops the start: exit 2, one line naming the file
// and what is wrong, nothing created.
func TestPolicyFileSmugglingRefusedAtStart(t *testing.T) {
	dir := t.TempDir()
	file := func(name, body string, mode os.FileMode, uid int) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, uid, 0); err != nil {
			t.Fatal(err)
		}
		return p
	}
	const good = `{"principals": [{"uid": 65534, "owners": ["team1-*"], "read_only": true}]}`
	nobodys := file("nobodys.json", good, 0o644, 65534)
	link := filepath.Join(dir, "link.json")
	if err := os.Symlink(nobodys, link); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(link, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, path, want string
	}{
		{"owners twice", file("owners.json", `{"principals": [{"uid": 65534, "owners": ["team1-*"], "owners": ["*"]}]}`, 0o600, 0),
			"principals[0].owners at line 1: given twice"},
		{"read_only in two cases", file("case.json", `{"principals": [{"uid": 65534, "owners": ["*"], "READ_ONLY": true, "Read_Only": false}]}`, 0o600, 0),
			`principals[0].READ_ONLY at line 1: differs only in case from "read_only"`},
		{"a second principals array", file("second.json", "{\"principals\": [{\"uid\": 65534, \"owners\": [\"team1-*\"], \"read_only\": true}],\n \"principals\": [{\"uid\": 65534, \"owners\": [\"*\"]}]}", 0o600, 0),
			"principals at line 2: given twice"},
		{"trailing garbage", file("trailing.json", good+"\n]garbage", 0o600, 0), "data after the policy's JSON value, at line 2"},
		{"over 1 MiB", file("big.json", good+strings.Repeat(" ", 1<<20), 0o600, 0), "larger than 1048576"},
		{"writable by everyone", file("world.json", good, 0o666, 0), "owner uid 0, mode 0666: must not be writable by group or others"},
		{"owned by nobody", nobodys, "owner uid 65534, mode 0644: must be owned by root"},
		{"a symlink owned by nobody", link, "a symlink (owner uid 65534, mode 0777)"},
		{"an owner that looks like another", file("lookalike.json", "{\"principals\": [{\"uid\": 65534, \"owners\": [\"team1-*\", \"rt-victim\u3164\"]}]}", 0o600, 0),
			`principals[0]: control policy: owners[1] "rt-victim\u3164": U+3164, outside ASCII (Lo, Hangul), at byte 9: names are printable ASCII`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHost(t)
			d := start(t, nil, h.args(freePort(t), "--control-policy="+tc.path)...)
			if code := d.wait(20 * time.Second); code != 2 {
				t.Fatalf("exit %d, want 2; output:\n%s", code, d.Output())
			}
			out := lines(d.Output())
			if len(out) != 1 || !strings.Contains(out[0], tc.path) || !strings.Contains(out[0], tc.want) {
				t.Fatalf("output %q, want one line naming %s with %q", out, tc.path, tc.want)
			}
			for _, dir := range []string{h.stateDir, h.netnsDir} {
				if _, err := os.Stat(dir); !os.IsNotExist(err) {
					t.Errorf("%s was created", dir)
				}
			}
		})
	}
}

// A rate that is no rate — NaN, an infinity, a negative number — is
// refused by serve --check with exit 2 and one line; a policy file without
// "rate" gets the default rate, and only "rate": 0 turns the limit off.
func TestControlRateChecked(t *testing.T) {
	h := newHost(t)
	for _, rate := range []string{"NaN", "+Inf", "Inf", "-Inf", "-1"} {
		out, code := cli(t, append(h.args(freePort(t), "--control-rate="+rate), "--check")...)
		if l := lines(out); code != 2 || len(l) != 1 || !strings.Contains(l[0], "want a finite number") {
			t.Errorf("serve --check --control-rate=%s: exit %d %q, want exit 2 and one line", rate, code, out)
		}
	}
	dir := t.TempDir()
	for _, tc := range []struct {
		body string
		want float64
	}{
		{`{"principals": []}`, 100},
		{`{"rate": 0, "principals": []}`, 0},
		{`{"rate": 7.5, "principals": []}`, 7.5},
	} {
		p := filepath.Join(dir, "policy.json")
		if err := os.WriteFile(p, []byte(tc.body), 0o600); err != nil {
			t.Fatal(err)
		}
		out, code := cli(t, append(h.args(freePort(t), "--control-policy="+p), "--check")...)
		var got struct {
			Rate *float64 `json:"control_rate"`
		}
		if code != 0 || json.Unmarshal([]byte(out), &got) != nil || got.Rate == nil || *got.Rate != tc.want {
			t.Errorf("serve --check with a policy of %s: exit %d %s, want control_rate %v", tc.body, code, out, tc.want)
		}
	}
}

// --ttl ≤ 0 is refused by the client, and a TTL ≤ 0 sent by a raw gRPC
// client is refused by the daemon: neither makes a lease, let alone one
// that never expires.
func TestNegativeTTLNeverLeases(t *testing.T) {
	h := newHost(t)
	d := start(t, nil, h.args(freePort(t), "--slots=64")...)
	d.waitServing(time.Minute)
	S := "--socket=" + d.control
	for _, ttl := range []string{"-5s", "0", "0s"} {
		out, code := cli(t, "slots", "acquire", "ttl-owner", "--ttl="+ttl, S)
		if l := lines(out); code != 2 || len(l) != 1 || !strings.Contains(l[0], "must be positive") {
			t.Errorf("slots acquire --ttl=%s: exit %d %q, want exit 2 and one line", ttl, code, out)
		}
	}
	root := d.slots()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, ttl := range []*durationpb.Duration{durationpb.New(-5 * time.Second), {Seconds: -1 << 40}, {}} {
		resp, err := root.Acquire(ctx, &phasegatev1.AcquireRequest{Owner: "ttl-owner", RequestId: "neg", Ttl: ttl})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("Acquire with ttl %v: %v %v, want InvalidArgument", ttl, resp, err)
		}
	}
	list, err := root.List(ctx, &phasegatev1.ListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range list.GetSlots() {
		if s.GetOwner() == "ttl-owner" {
			t.Errorf("a lease was made: %v", s)
		}
	}
	d.signal(syscall.SIGTERM)
	if code := d.wait(time.Minute); code != 0 {
		t.Fatalf("stop: exit %d", code)
	}
	h.decommission(h.prefix)
}

// /debug/slots on the control socket spends the caller's rate like the
// gRPC calls: a permitted tenant flooding it gets 429 with Retry-After
// past its burst, while root's calls, gRPC and HTTP, are served
// throughout and health answers 200.
func TestDebugSlotsUnderTheRate(t *testing.T) {
	pub := newPublicDir(t)
	h := newHost(t)
	sock := filepath.Join(pub.dir, "control.sock")
	const rate, n = 20, 600
	d := start(t, nil, h.args(freePort(t), "--slots=64", "--control-socket="+sock, "--control-group=nogroup",
		"--allow=uid:65534=tenant-b-*", fmt.Sprintf("--control-rate=%d", rate))...)
	d.waitServing(time.Minute)
	stopHealth := watchHealth(t, d)
	root, rootHTTP := d.slots(), unixHTTP(sock)

	var rootCalls, rootFailed atomic.Int64
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for {
			select {
			case <-done:
				return
			case <-time.After(10 * time.Millisecond):
			}
			_, err := root.List(ctx, &phasegatev1.ListRequest{})
			resp, herr := rootHTTP.Get("http://control/debug/slots")
			if herr == nil {
				resp.Body.Close()
			}
			rootCalls.Add(2)
			if err != nil || herr != nil || resp.StatusCode != http.StatusOK {
				rootFailed.Add(1)
			}
		}
	})
	cmd := exec.Command("runuser", "-u", "nobody", "--", pub.testBinary)
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s|%d", debugFloodEnv, sock, n))
	cmd.Dir = pub.dir
	out, err := cmd.Output()
	close(done)
	wg.Wait()
	if err != nil {
		t.Fatalf("flood as nobody: %v %s", err, out)
	}
	res := map[string]int{}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("flood as nobody: %q: %v", out, err)
	}
	t.Logf("%d GET /debug/slots as nobody (%d calls/s, bursts of %d) in %d ms: %v; root made %d calls meanwhile",
		n, rate, 2*rate, res["ms"], res, rootCalls.Load())
	// What the bucket can have given: its burst and its rate over the
	// flood, with a second to spare for the clocks.
	most := 2*rate + rate*(res["ms"]/1000+1)
	// Its 8 connections kept, a few dialed again when one closes between
	// requests (the transport dials anew then): what matters is that the
	// flood did not dial per request, which would meet the socket's bound
	// of 16 at once, and this test is of the rate. Every answer was 200
	// or 429 (below): none was refused.
	if res["dialed"] > 16 {
		t.Errorf("the flood dialed %d connections for %d requests, want its 8 kept", res["dialed"], n)
	}
	if res["200"]+res["429"] != n || res["429"] == 0 || res["200"] > most {
		t.Errorf("the flood's answers %v: want only 200 and 429 (with Retry-After), at most %d of them 200", res, most)
	}
	if rootCalls.Load() == 0 || rootFailed.Load() != 0 {
		t.Errorf("root's calls during the flood: %d of %d failed", rootFailed.Load(), rootCalls.Load())
	}
	polls, failed := stopHealth()
	if polls == 0 || failed != 0 {
		t.Errorf("health during the flood: %d of %d polls not 200", failed, polls)
	}
	d.signal(syscall.SIGTERM)
	if code := d.wait(time.Minute); code != 0 {
		t.Fatalf("stop: exit %d", code)
	}
	if !strings.Contains(d.Output(), `msg="control call refused" audit=true method="GET /debug/slots" surface=socket principal=uid:65534`) {
		t.Error("no audit line of nobody's refused GET /debug/slots")
	}
	h.decommission(h.prefix)
}
