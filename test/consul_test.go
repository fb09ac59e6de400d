package test

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"net/http"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"

	"github.com/phasegate/phasegate/health"
	"github.com/phasegate/phasegate/internal/longbody"
)

// consulFile is the deploy file whose checks Consul's agent runs.
const consulFile = "../deploy/nomad/phasegate-consul.nomad.hcl"

// consulInterval replaces the file's check interval in these tests. The
// shipped 5s is longer than the whole start the test can make and than the
// file's --drain-delay: Consul would see neither the start nor the drain
// (docs/DEPLOYING.md says how the two must relate). 1s is
// Consul's floor: it raises anything shorter to it.
const consulInterval = time.Second

// consulCheckAttrs are the check attributes the translation below knows.
// A new one in the deploy file fails the test until it is taught: a check
// the test runs differently from the file would prove nothing.
var consulCheckAttrs = map[string]bool{
	"name": true, "type": true, "port": true, "interval": true, "timeout": true,
	"grpc_service": true, "grpc_use_tls": true, "tls_skip_verify": true, "tls_server_name": true,
	"path": true, "protocol": true, "method": true,
}

// consulCheckDef translates one of a Nomad job's check stanzas into the
// check definition Nomad registers with Consul's agent API for it, the
// address being the service's (port "api"), the interval the test's.
func consulCheckDef(t *testing.T, ev nomadEval, chk *hclsyntax.Body, addr string) map[string]any {
	t.Helper()
	name := ev.str(chk, "name", "")
	for a := range chk.Attributes {
		if !consulCheckAttrs[a] {
			t.Fatalf("check %s: attribute %s is not translated to Consul's API; teach consulCheckDef", name, a)
		}
	}
	for _, b := range chk.Blocks {
		if b.Type != "check_restart" { // Nomad's own, never sent to Consul
			t.Fatalf("check %s: block %s is not translated to Consul's API", name, b.Type)
		}
	}
	if p := ev.str(chk, "port", "api"); p != "api" {
		t.Fatalf("check %s probes port %q, the daemon's is api", name, p)
	}
	def := map[string]any{
		"CheckID":       name,
		"Name":          name,
		"Interval":      consulInterval.String(),
		"Timeout":       ev.dur(chk, "timeout", 0).String(),
		"TLSSkipVerify": ev.boolean(chk, "tls_skip_verify"),
		"TLSServerName": ev.str(chk, "tls_server_name", ""),
	}
	switch typ := ev.str(chk, "type", ""); typ {
	case "grpc":
		target := addr
		if s := ev.str(chk, "grpc_service", ""); s != "" {
			target += "/" + s
		}
		def["GRPC"] = target
		def["GRPCUseTLS"] = ev.boolean(chk, "grpc_use_tls")
	case "http":
		def["HTTP"] = ev.str(chk, "protocol", "http") + "://" + addr + ev.str(chk, "path", "/")
		def["Method"] = ev.str(chk, "method", "GET")
	default:
		t.Fatalf("check %s: type %q is not translated to Consul's API", name, typ)
	}
	return def
}

// consulJob is what the test takes from the deploy file: the daemon's
// command line and environment with Nomad's runtime variables filled, and
// the Consul check definitions of its service.
type consulJob struct {
	addr   string
	env    []string
	args   []string
	checks []map[string]any
	// interval is the longest of the file's check intervals (the checks
	// above carry the test's).
	interval time.Duration
}

// loadConsulJob reads consulFile as testNomadJob does for the node n,
// writing the certificate its template renders into the task directory.
func loadConsulJob(t *testing.T, n *node) consulJob {
	t.Helper()
	job := block(t, hclBody(t, consulFile), "job", "phasegate")
	group := block(t, job, "group", "phasegate")
	taskDir := t.TempDir()
	ev := nomadEval{t: t, vars: map[string]cty.Value{}}
	static, ok := ev.value(block(t, block(t, group, "network"), "port", "api"), "static")
	if !ok {
		t.Fatal(`port "api" has no static port`)
	}
	port, _ := static.AsBigFloat().Int64()
	j := consulJob{addr: net.JoinHostPort(n.ip.String(), strconv.FormatInt(port, 10))}
	for k, v := range map[string]string{
		"NOMAD_IP_api":      n.ip.String(),
		"NOMAD_PORT_api":    strconv.FormatInt(port, 10),
		"NOMAD_ADDR_api":    j.addr,
		"NOMAD_SECRETS_DIR": filepath.Join(taskDir, "secrets"),
		"NOMAD_TASK_DIR":    filepath.Join(taskDir, "local"),
	} {
		ev.vars[k] = cty.StringVal(v)
	}
	task := block(t, group, "task", "phasegate")
	argsVal, ok := ev.value(block(t, task, "config"), "args")
	if !ok {
		t.Fatal("config has no args")
	}
	for _, v := range argsVal.AsValueSlice() {
		j.args = append(j.args, v.AsString())
	}
	j.env = baseEnv()
	for k, v := range ev.vars {
		j.env = append(j.env, k+"="+v.AsString())
	}
	for _, e := range blocks(task, "env") {
		for name := range e.Attributes {
			j.env = append(j.env, name+"="+ev.str(e, name, ""))
		}
	}
	// What Vault's pki engine would issue is what the test's CA issues;
	// testNomadJob checks the template's shape.
	certs := newCerts(t)
	for _, tb := range blocks(task, "template") {
		var b bytes.Buffer
		b.Write(pemFile(t, certs.ServerCert))
		b.Write(pemFile(t, certs.CAFile))
		b.Write(pemFile(t, certs.ServerKey))
		writeFile(t, filepath.Join(taskDir, ev.str(tb, "destination", "")), b.Bytes(), 0o600)
	}
	for _, svc := range blocks(group, "service") {
		if p := ev.str(svc, "provider", "consul"); p != "consul" {
			t.Fatalf("service provider %q: this file's checks are Consul's", p)
		}
		for _, chk := range blocks(svc, "check") {
			j.checks = append(j.checks, consulCheckDef(t, ev, chk, j.addr))
			j.interval = max(j.interval, ev.dur(chk, "interval", 0))
		}
	}
	if len(j.checks) == 0 {
		t.Fatal("the job has no service check")
	}
	return j
}

// TestConsulChecks runs the deploy file's checks in a real Consul agent
// against the daemon started with the file's arguments, and reads Consul's
// own view: every check critical while the daemon starts (the HTTP check
// saying which phase), passing once it serves, critical again on SIGTERM
// for the file's --drain-delay, before the port closes.
func TestConsulChecks(t *testing.T) {
	t.Run("tls", func(t *testing.T) { testConsulChecks(t, false) })
	// The same checks of a daemon serving plain text, as on a host where
	// the port stays on the node (the systemd unit's loopback): the file's
	// TLS flags and settings left out, --insecure for the node's address.
	t.Run("plain", func(t *testing.T) { testConsulChecks(t, true) })
}

// plainJob is j without TLS: the daemon's certificate flags dropped (and
// --insecure, as its address is not loopback), the checks speaking plain
// HTTP and gRPC.
func plainJob(j consulJob) consulJob {
	var args []string
	for _, a := range j.args {
		if !strings.HasPrefix(a, "--tls-") {
			args = append(args, a)
		}
	}
	j.args = append(args, "--insecure")
	var checks []map[string]any
	for _, c := range j.checks {
		p := maps.Clone(c)
		p["TLSSkipVerify"], p["TLSServerName"] = false, ""
		if u, ok := p["HTTP"].(string); ok {
			p["HTTP"] = "http://" + strings.TrimPrefix(u, "https://")
		}
		if _, ok := p["GRPC"]; ok {
			p["GRPCUseTLS"] = false
		}
		checks = append(checks, p)
	}
	j.checks = checks
	return j
}

// testConsulChecks is TestConsulChecks over TLS or, with plain, without:
// the job's checks registered in Consul, the daemon started slowly enough
// for Consul to look during its start, then stopped.
func testConsulChecks(t *testing.T, plain bool) {
	n := newNode(t)
	h := newHost(t)
	c := startConsul(t, n)
	j := loadConsulJob(t, n)
	if plain {
		j = plainJob(j)
	}
	r := n.check(j.env, j.args)
	if r.TLS == plain {
		t.Fatalf("the daemon's TLS is %v, want %v", r.TLS, !plain)
	}
	drain, err := time.ParseDuration(r.DrainDelay)
	if err != nil {
		t.Fatal(err)
	}
	if drain < 2*consulInterval {
		t.Fatalf("--drain-delay %v: under two check intervals (%v) Consul may not look during the drain", drain, consulInterval)
	}

	// A start long enough for several check intervals: leaked slots to
	// reclaim, left where the daemon runs, and --reclaim=foreground, the
	// one flag the test adds to the file's (after confine's). With the
	// file's background reclaim the daemon serves within ~100 ms of its
	// exec whatever was leaked: no checker at Consul's 1 s floor sees that
	// start.
	h.node = n
	h.leak(h.prefix, 1, 5000)
	extra := []string{"--reclaim=foreground"}

	ids := registerConsulService(t, c, n, j)
	d := n.start(j.addr, n.command(j.env, append(append(append([]string{binary}, j.args...), confine(h)...), extra...)...))
	rec := recordConsul(t, c, d)
	checkConsulSawTheStart(t, rec, d, ids)
	checkConsulSawTheDrain(t, rec, d, ids, r)
}

// registerConsulService registers the job's service with its checks in
// the agent and returns the checks' IDs.
func registerConsulService(t *testing.T, c *consulAgent, n *node, j consulJob) []string {
	t.Helper()
	svcPort, _ := strconv.Atoi(j.addr[strings.LastIndexByte(j.addr, ':')+1:])
	if err := c.call("PUT", "/v1/agent/service/register", map[string]any{
		"ID": "phasegate", "Name": "phasegate", "Address": n.ip.String(), "Port": svcPort, "Checks": j.checks,
	}, nil); err != nil {
		t.Fatal(err)
	}
	ids := make([]string, len(j.checks))
	for i, chk := range j.checks {
		ids[i] = chk["CheckID"].(string)
	}
	return ids
}

// recordConsul records the agent's checks from d's exec until the test
// ends.
func recordConsul(t *testing.T, c *consulAgent, d *daemon) *consulRecorder {
	t.Helper()
	rec := new(consulRecorder)
	stop := make(chan struct{})
	stopped := make(chan struct{})
	go func() { rec.record(c, d.Began(), stop); close(stopped) }()
	t.Cleanup(func() { close(stop); <-stopped })
	return rec
}

// checkConsulSawTheStart checks what Consul showed while the daemon
// started: each check ran against it and failed (the HTTP one naming the
// phase), then passed once it served, and no output claimed a step that
// was over.
func checkConsulSawTheStart(t *testing.T, rec *consulRecorder, d *daemon, ids []string) {
	t.Helper()
	// Starting: each check ran against the daemon and failed, the HTTP one
	// naming the phase. A check registered before its first run is critical
	// with no output, so an output is what proves Consul looked.
	starting := map[string]int{}
	for _, id := range ids {
		waitFor(t, serveTimeout, "consul check "+id+" to run critical while starting", func() bool {
			i := rec.find(0, id, func(e consulEvent) bool {
				return e.status == "critical" && (strings.HasSuffix(e.output, "serving status: NOT_SERVING") ||
					strings.HasPrefix(healthOutput(e.output), "starting: phase "))
			})
			starting[id] = i
			if i < 0 && rec.find(0, id, func(e consulEvent) bool { return e.status == "passing" }) >= 0 {
				t.Fatalf("Consul saw %s pass before any run during the start (serving at %s, interval %v): the start was too short to see; leak more slots\n%s",
					id, servingAt(d), consulInterval, rec.timeline(0))
			}
			return i >= 0
		})
	}
	// Serving: every check passing.
	serving := map[string]int{}
	for _, id := range ids {
		waitFor(t, serveTimeout, "consul check "+id+" to pass", func() bool {
			i := rec.find(starting[id], id, func(e consulEvent) bool { return e.status == "passing" })
			serving[id] = i
			return i >= 0
		})
	}
	if !d.running() {
		t.Fatalf("the daemon exited: %v", d.Err())
	}
	// No message claims a step that is over: a complete count says what the
	// phase waits on now, not the step that counted.
	rec.mu.Lock()
	for _, e := range rec.events {
		if m := countRe.FindStringSubmatch(healthOutput(e.output)); m != nil && m[1] == m[2] && (m[3] == "scanning" || m[3] == "unlinking") {
			t.Errorf("at %v Consul showed a finished count under an earlier step: %s", e.at, m[0])
		}
	}
	rec.mu.Unlock()
	t.Logf("Consul's view of the start (times since exec; serving at %v by the daemon's log):\n%s", servingAt(d), rec.timeline(0))
}

// checkConsulSawTheDrain sends SIGTERM and checks Consul saw every check
// critical while the daemon still ran (the drain delay), not only once
// the port closed, each saying the daemon drains.
func checkConsulSawTheDrain(t *testing.T, rec *consulRecorder, d *daemon, ids []string, r resolved) {
	t.Helper()
	from := rec.len()
	termAt := time.Since(d.Began())
	d.signal(syscall.SIGTERM)
	for _, id := range ids {
		waitFor(t, serveTimeout, "consul check "+id+" critical on drain", func() bool {
			return rec.find(from, id, func(e consulEvent) bool { return e.status == "critical" }) >= 0
		})
	}
	if !d.running() {
		t.Errorf("the daemon exited before Consul saw every check critical: the drain went unseen\n%s", rec.timeline(from))
	}
	for _, id := range ids {
		i := rec.find(from, id, func(e consulEvent) bool { return e.status == "critical" })
		rec.mu.Lock()
		e := rec.events[i]
		rec.mu.Unlock()
		if !strings.HasSuffix(e.output, "serving status: NOT_SERVING") && healthOutput(e.output) != "draining" {
			t.Errorf("check %s on drain: output %q does not say the daemon is draining", id, e.output)
		}
	}
	d.waitExit(r.stopBudget()+5*time.Second, "the stop budget")
	t.Logf("Consul's view of the drain (times since exec; SIGTERM at %v, exited at %v):\n%s",
		termAt.Round(10*time.Millisecond), d.Exited().Sub(d.Began()).Round(10*time.Millisecond), rec.timeline(from))
}

// TestConsulLongHealthBody serves a /health body well over the 4 KiB Consul
// keeps (sixty phases, eight long warnings) to a real Consul HTTP check,
// and reads the verdict in Consul's Output: Consul keeps the end, so the
// body's front (its leading status and output) is gone and the closing
// verdict must carry them. The body is the health package's own handler
// over a real lifecycle, served inside the node: no daemon start has this
// many phases.
func TestConsulLongHealthBody(t *testing.T) {
	n := newNode(t)
	c := startConsul(t, n)

	lc := longbody.Start(t)
	hc := health.New(lc, health.Options{Version: "test"})
	t.Cleanup(hc.Close)
	mux := http.NewServeMux()
	health.NewHandler(hc).Mount(mux)

	var l net.Listener
	if err := n.inNamespace(func() error {
		var err error
		l, err = net.Listen("tcp", net.JoinHostPort(n.ip.String(), "0"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: mux}
	served := make(chan struct{})
	go func() { _ = srv.Serve(l); close(served) }()
	t.Cleanup(func() { srv.Close(); <-served })

	url := "http://" + l.Addr().String() + health.PathHealth
	if err := c.call("PUT", "/v1/agent/check/register", map[string]any{
		"ID": "long-health", "Name": "long-health", "HTTP": url,
		"Interval": consulInterval.String(), "Timeout": "2s",
	}, nil); err != nil {
		t.Fatal(err)
	}
	var got consulCheckState
	waitFor(t, time.Minute, "consul to run the check on the long body", func() bool {
		m, err := c.checks()
		if err != nil {
			return false
		}
		got = m["long-health"]
		return strings.Contains(got.Output, "Output: ")
	})
	body := got.Output[strings.Index(got.Output, "Output: ")+len("Output: "):]
	if len(body) >= 4096+1 || strings.HasPrefix(body, `{"status"`) {
		t.Fatalf("Consul kept %d bytes starting %.60q: the body was not cut, the test proves nothing", len(body), body)
	}
	if got.Status != "critical" {
		t.Errorf("check status %q, want critical (503 while starting)", got.Status)
	}
	if o := healthOutput(got.Output); !strings.HasPrefix(o, "starting: phase slow") {
		t.Errorf("verdict in Consul's Output says %q, want starting: phase slow…\n%s", o, got.Output)
	}
	t.Logf("Consul kept the last %d bytes of the body; its verdict: %s", len(body), healthOutput(got.Output))
}

// countRe finds a phase's count and the message after it in an output.
var countRe = regexp.MustCompile(`(\d+)/(\d+) namespaces: ([a-z ]+)`)

// servingAt is when the daemon said it serves, from its log's startup=
// figure, or "?" before.
func servingAt(d *daemon) string {
	m := regexp.MustCompile(`msg=serving .*startup=(\S+)`).FindStringSubmatch(d.Output())
	if m == nil {
		return "?"
	}
	return m[1]
}

// TestConsulDrainShorterThanIntervalWarns gives the daemon the Consul
// file's own check interval as --check-interval: the file's --drain-delay is
// shorter, which under a direct Consul registration hides the drain
// (docs/DEPLOYING.md), so the serving daemon says so in /health.
func TestConsulDrainShorterThanIntervalWarns(t *testing.T) {
	n := newNode(t)
	h := newHost(t)
	j := loadConsulJob(t, n)
	r := n.check(j.env, j.args)
	if drain, _ := time.ParseDuration(r.DrainDelay); drain > j.interval {
		t.Skipf("the file's --drain-delay %v exceeds its check interval %v: nothing to warn of", drain, j.interval)
	}
	d := n.start(j.addr, n.command(j.env, append(append(append([]string{binary}, j.args...), confine(h)...), "--check-interval="+j.interval.String())...))
	tr := &http.Transport{DialContext: n.dial, TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	var doc struct {
		Status string
		Output string
	}
	waitPass(t, serveTimeout, "/health to warn of the drain delay", func() error {
		if !d.running() {
			t.Fatalf("the daemon exited: %v", d.Err())
		}
		resp, err := (&http.Client{Transport: tr, Timeout: 2 * time.Second}).Get("https://" + j.addr + "/health")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
			return err
		}
		if resp.StatusCode != http.StatusOK || doc.Status != "warn" || !strings.Contains(doc.Output, "drain-delay: --drain-delay "+r.DrainDelay+" is not longer than --check-interval "+j.interval.String()) {
			return fmt.Errorf("%d %s: %s", resp.StatusCode, doc.Status, doc.Output)
		}
		return nil
	})
	t.Logf("/health: %s", doc.Output)
}
