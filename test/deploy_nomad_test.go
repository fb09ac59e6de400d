package test

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/phasegate/phasegate/internal/testcerts"
)

// nomadMaxKillTimeout is a Nomad client's default max_kill_timeout: every
// task's kill_timeout is capped at it.
const nomadMaxKillTimeout = 30 * time.Second

// TestDeployNomad runs the job with Nomad's native service provider and
// TestDeployNomadConsul the one registered in Consul, each as testNomadJob
// says.
func TestDeployNomad(t *testing.T) { testNomadJob(t, "../deploy/nomad/phasegate.nomad.hcl") }

func TestDeployNomadConsul(t *testing.T) {
	testNomadJob(t, "../deploy/nomad/phasegate-consul.nomad.hcl")
}

// nomadEval evaluates a job file's attributes with the runtime variables
// Nomad interpolates (NOMAD_IP_api, NOMAD_SECRETS_DIR, …) set to the test
// node's values. A variable the test does not fill is an error that names
// it.
type nomadEval struct {
	t    *testing.T
	vars map[string]cty.Value
}

func (e nomadEval) value(b *hclsyntax.Body, name string) (cty.Value, bool) {
	e.t.Helper()
	a, ok := b.Attributes[name]
	if !ok {
		return cty.NilVal, false
	}
	v, diags := a.Expr.Value(&hcl.EvalContext{Variables: e.vars})
	if diags.HasErrors() {
		e.t.Fatalf("attribute %s: %v (a Nomad runtime variable the test does not fill? add it to the node's variables)", name, diags)
	}
	return v, true
}

func (e nomadEval) str(b *hclsyntax.Body, name, def string) string {
	e.t.Helper()
	v, ok := e.value(b, name)
	if !ok {
		return def
	}
	return v.AsString()
}

func (e nomadEval) boolean(b *hclsyntax.Body, name string) bool {
	e.t.Helper()
	v, ok := e.value(b, name)
	return ok && v.True()
}

func (e nomadEval) dur(b *hclsyntax.Body, name string, def time.Duration) time.Duration {
	e.t.Helper()
	s := e.str(b, name, "")
	if s == "" {
		return def
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		e.t.Fatalf("%s = %q: %v", name, s, err)
	}
	return d
}

// nomadCheck is a service check as Nomad or Consul runs it.
type nomadCheck struct {
	name, provider, typ string
	run                 func() error // one check; nil error: passing
}

// testNomadJob runs a system job's task on a node: its args with Nomad's
// runtime variables filled, its env, the certificate its template renders
// (the test's CA stands in for Vault's pki engine), until every service
// check passes as its provider runs it; then a renewal (new files, the
// template's change_signal: the same pid serves the new certificate), and
// kill_signal, after which the daemon must exit 0 within kill_timeout.
func testNomadJob(t *testing.T, file string) {
	n := newNode(t)
	h := newHost(t)
	job := block(t, hclBody(t, file), "job", "phasegate")
	taskDir := t.TempDir() // the task's working directory: secrets/, local/
	ev := nomadEval{t: t, vars: map[string]cty.Value{}}
	if s := ev.str(job, "type", "service"); s != "system" {
		t.Errorf("job type %q: a node daemon is a system job", s)
	}
	group := block(t, job, "group", "phasegate")
	static, ok := ev.value(block(t, block(t, group, "network"), "port", "api"), "static")
	if !ok {
		t.Fatal(`port "api" has no static port: the daemon's port must be the same on every node`)
	}
	port, _ := static.AsBigFloat().Int64()
	addr := net.JoinHostPort(n.ip.String(), strconv.FormatInt(port, 10))
	for k, v := range map[string]string{
		"NOMAD_IP_api":      n.ip.String(),
		"NOMAD_PORT_api":    strconv.FormatInt(port, 10),
		"NOMAD_ADDR_api":    addr,
		"NOMAD_SECRETS_DIR": filepath.Join(taskDir, "secrets"),
		"NOMAD_TASK_DIR":    filepath.Join(taskDir, "local"),
	} {
		ev.vars[k] = cty.StringVal(v)
	}

	task := block(t, group, "task", "phasegate")
	if d := ev.str(task, "driver", ""); d != "raw_exec" {
		t.Errorf("driver %q: the daemon needs the host's network namespace and mounts (raw_exec)", d)
	}
	config := block(t, task, "config")
	if c := ev.str(config, "command", ""); c != productionBinary {
		t.Fatalf("command %q: the test runs the binary under test in place of %s", c, productionBinary)
	}
	argsVal, ok := ev.value(config, "args")
	if !ok {
		t.Fatal("config has no args")
	}
	var args []string
	for _, v := range argsVal.AsValueSlice() {
		args = append(args, v.AsString())
	}
	env := baseEnv()
	for k, v := range ev.vars {
		env = append(env, k+"="+v.AsString())
	}
	for _, e := range blocks(task, "env") {
		for name := range e.Attributes {
			env = append(env, name+"="+ev.str(e, name, ""))
		}
	}

	// The templates: what Vault's pki engine would issue is what the test's
	// CA issues, written where the template renders it.
	certs := newCerts(t)
	type rendered struct {
		path                     string
		perm                     os.FileMode
		changeMode, changeSignal string
		issue                    func(*testcerts.Set) []byte
	}
	var templates []rendered
	for _, tb := range blocks(task, "template") {
		dest := ev.str(tb, "destination", "")
		if dest == "" || filepath.IsAbs(dest) {
			t.Fatalf("template destination %q: the test renders only into the task directory", dest)
		}
		data := ev.str(tb, "data", "")
		if !strings.Contains(data, `secret "pki/issue/`) || !strings.Contains(data, ".Data.certificate") ||
			!strings.Contains(data, ".Data.private_key") || strings.Count(data, "secret ") != 1 {
			t.Fatalf("template %s: the test knows one kind, a single Vault pki issue rendering certificate and private key; teach it this one:\n%s", dest, data)
		}
		perm, err := strconv.ParseUint(ev.str(tb, "perms", "0644"), 8, 32)
		if err != nil {
			t.Fatalf("template %s perms: %v", dest, err)
		}
		templates = append(templates, rendered{
			path:         filepath.Join(taskDir, dest),
			perm:         os.FileMode(perm),
			changeMode:   ev.str(tb, "change_mode", "restart"),
			changeSignal: ev.str(tb, "change_signal", ""),
			issue: func(c *testcerts.Set) []byte {
				var b bytes.Buffer
				b.Write(pemFile(t, c.ServerCert)) // .Data.certificate
				if strings.Contains(data, ".Data.issuing_ca") {
					b.Write(pemFile(t, c.CAFile))
				}
				b.Write(pemFile(t, c.ServerKey)) // .Data.private_key
				return b.Bytes()
			},
		})
	}
	for _, tm := range templates {
		writeFile(t, tm.path, tm.issue(certs), tm.perm)
	}

	// Budgets: the daemon's, from its own arguments.
	r := n.check(env, args)
	if !r.TLS {
		t.Errorf("the job serves %s without TLS", r.Listen)
	}
	if r.Listen != addr {
		t.Errorf("the daemon listens on %s, the job's port is %s", r.Listen, addr)
	}
	killSignal := signalNamed(t, ev.str(task, "kill_signal", "SIGINT")) // Nomad's default is SIGINT
	killTimeout := ev.dur(task, "kill_timeout", 5*time.Second)
	if killTimeout <= r.stopBudget() {
		t.Errorf("kill_timeout %v does not exceed the daemon's stop budget %v: Nomad would SIGKILL an orderly stop", killTimeout, r.stopBudget())
	}
	t.Logf("stop budget %v (drain %s, stop timeout %s), kill_timeout %v; start budget %v", r.stopBudget(), r.DrainDelay, r.StopTimeout, killTimeout, r.startBudget(t))
	if killTimeout > nomadMaxKillTimeout {
		t.Errorf("kill_timeout %v exceeds Nomad's default max_kill_timeout %v, which caps it: lower --drain-delay/--stop-timeout or document the client setting", killTimeout, nomadMaxKillTimeout)
	}

	if _, ok := task.Attributes["shutdown_delay"]; ok && len(blocks(group, "service")) > 0 {
		t.Error("shutdown_delay on the task: Nomad deregisters the group's services before a kill only for the group's shutdown_delay")
	}

	// The service checks, as their provider runs them.
	var checks []nomadCheck
	for _, svc := range blocks(group, "service") {
		provider := ev.str(svc, "provider", "consul")
		if p := ev.str(svc, "port", ""); p != "api" {
			t.Errorf("service port %q, want the label api", p)
		}
		for _, chk := range blocks(svc, "check") {
			checks = append(checks, nomadServiceCheck(t, n, ev, provider, chk, addr))
			for _, cr := range blocks(chk, "check_restart") {
				if g := ev.dur(cr, "grace", 0); g < r.startBudget(t) {
					t.Errorf("check %s: check_restart grace %v < --start-timeout plus the stop budget (%v): Nomad would restart a start the daemon still bounds itself",
						ev.str(chk, "name", "?"), g, r.startBudget(t))
				}
			}
		}
	}
	if len(checks) == 0 {
		t.Fatal("the job has no service check")
	}

	// The task's memory limit, as Nomad's executor sets it (MiB): a cgroup.
	res := block(t, task, "resources")
	mem, ok := ev.value(res, "memory_max")
	if !ok {
		if mem, ok = ev.value(res, "memory"); !ok {
			t.Fatal("the task has no resources.memory: the test floods the port under it")
		}
	}
	mib, _ := mem.AsBigFloat().Int64()
	cg := newMemoryCgroup(t, mib<<20)
	d := n.start(addr, n.command(env, cg.wrap(append(append([]string{binary}, args...), confine(h)...)...)...))
	for _, c := range checks {
		waitPass(t, serveTimeout, fmt.Sprintf("%s %s check %q to pass", c.provider, c.typ, c.name), c.run)
	}
	if out, err := n.verifiedProbe(addr, certs); err != nil || out != "SERVING" {
		t.Errorf("a client verifying the certificate against the CA: %v: %s", err, out)
	}
	assertControlGuarded(t, n, d, h, certs)
	floodUnderTheLimit(t, n, d, cg, addr)
	for _, c := range checks {
		waitPass(t, serveTimeout, fmt.Sprintf("%s check %q after the floods", c.typ, c.name), c.run)
	}

	// A renewed certificate: the template re-renders and signals.
	for _, tm := range templates {
		if tm.changeMode != "signal" {
			t.Logf("template %s: change_mode %s (not exercised)", tm.path, tm.changeMode)
			continue
		}
		renewed := newCerts(t)
		writeFile(t, tm.path, tm.issue(renewed), tm.perm)
		signaled := time.Now()
		d.signal(signalNamed(t, tm.changeSignal))
		waitPass(t, serveTimeout, "the daemon to serve the renewed certificate", func() error {
			if !d.running() {
				t.Fatalf("the daemon exited on %s: %v", tm.changeSignal, d.Err())
			}
			c, err := n.peerCertificate(addr)
			if err != nil {
				return err
			}
			if !bytes.Equal(c.Raw, renewed.Server.Certificate[0]) {
				return fmt.Errorf("still serving certificate serial %v", c.SerialNumber)
			}
			return nil
		})
		t.Logf("renewed certificate served %v after %s, same pid", time.Since(signaled).Round(time.Millisecond), tm.changeSignal)
		for _, c := range checks {
			waitPass(t, serveTimeout, fmt.Sprintf("%s check %q after the renewal", c.typ, c.name), c.run)
		}
		if out, err := n.verifiedProbe(addr, renewed); err != nil || out != "SERVING" {
			t.Errorf("after the renewal, a client verifying against the new CA: %v: %s", err, out)
		}
	}

	stopAt := time.Now()
	d.signal(killSignal)
	d.waitExit(killTimeout, "kill_timeout")
	t.Logf("stopped %v after %v", time.Since(stopAt).Round(time.Millisecond), killSignal)
}

// nomadServiceCheck returns one check of a job's service as its provider
// runs it: Nomad's native checker (http: pass below 400) or Consul's agent
// (http: pass on 2xx; grpc: pass on SERVING), each over TLS when the check
// says so, verifying the certificate against the system's roots unless
// tls_skip_verify.
func nomadServiceCheck(t *testing.T, n *node, ev nomadEval, provider string, chk *hclsyntax.Body, addr string) nomadCheck {
	t.Helper()
	c := nomadCheck{name: ev.str(chk, "name", ""), provider: provider, typ: ev.str(chk, "type", "")}
	if p := ev.str(chk, "port", "api"); p != "api" {
		t.Errorf("check %s probes port %q, the daemon's is api", c.name, p)
	}
	timeout := ev.dur(chk, "timeout", 0)
	if timeout < time.Second {
		t.Errorf("check %s: timeout %v (Nomad requires at least 1s)", c.name, timeout)
	}
	tlsCfg := &tls.Config{
		InsecureSkipVerify: ev.boolean(chk, "tls_skip_verify"),
		ServerName:         ev.str(chk, "tls_server_name", ""),
	}
	switch c.typ {
	case "http":
		if m := ev.str(chk, "method", "GET"); m != "GET" {
			t.Errorf("check %s: method %s", c.name, m)
		}
		url := ev.str(chk, "protocol", "http") + "://" + addr + ev.str(chk, "path", "")
		c.run = func() error {
			code, err := n.httpGet(url, tlsCfg, timeout)
			switch {
			case err != nil:
				return err
			case provider == "nomad" && code >= 400, provider == "consul" && (code < 200 || code > 299):
				return fmt.Errorf("GET %s: %d", url, code)
			}
			return nil
		}
	case "grpc":
		if provider == "nomad" {
			t.Fatalf("check %s: Nomad's native provider cannot run grpc checks", c.name)
		}
		creds := insecure.NewCredentials()
		if ev.boolean(chk, "grpc_use_tls") {
			creds = credentials.NewTLS(tlsCfg)
		}
		service := ev.str(chk, "grpc_service", "")
		c.run = func() error {
			st, err := n.grpcHealth(addr, service, creds, timeout)
			if err != nil {
				return err
			}
			if st != healthpb.HealthCheckResponse_SERVING {
				return fmt.Errorf("grpc health %q: %v", service, st)
			}
			return nil
		}
	default:
		t.Fatalf("check %s: type %q is not emulated", c.name, c.typ)
	}
	return c
}

// hclBody parses an HCL file.
func hclBody(t *testing.T, path string) *hclsyntax.Body {
	t.Helper()
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	f, diags := hclsyntax.ParseConfig(src, path, hcl.InitialPos)
	if diags.HasErrors() {
		t.Fatalf("%s: %v", path, diags)
	}
	return f.Body.(*hclsyntax.Body)
}

// block returns the only nested block of type typ (with labels, if given).
func block(t *testing.T, b *hclsyntax.Body, typ string, labels ...string) *hclsyntax.Body {
	t.Helper()
	var found []*hclsyntax.Block
	for _, blk := range b.Blocks {
		if blk.Type == typ && (len(labels) == 0 || strings.Join(blk.Labels, "/") == strings.Join(labels, "/")) {
			found = append(found, blk)
		}
	}
	if len(found) != 1 {
		t.Fatalf("want one %s block %v, found %d", typ, labels, len(found))
	}
	return found[0].Body
}

func blocks(b *hclsyntax.Body, typ string) []*hclsyntax.Body {
	var out []*hclsyntax.Body
	for _, blk := range b.Blocks {
		if blk.Type == typ {
			out = append(out, blk.Body)
		}
	}
	return out
}
