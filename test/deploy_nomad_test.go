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
	"syscall"
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
	jt := readNomadTask(t, n, file)
	certs := newCerts(t)
	templates := jt.templates(t)
	for _, tm := range templates {
		writeFile(t, tm.path, tm.issue(certs), tm.perm)
	}

	// Budgets: the daemon's, from its own arguments.
	r := n.check(jt.env, jt.args)
	killSignal, killTimeout := jt.checkBudgets(t, r)
	checks := jt.serviceChecks(t, n, r)

	cg := newMemoryCgroup(t, jt.memoryLimit(t))
	d := n.start(jt.addr, n.command(jt.env, cg.wrap(append(append([]string{binary}, jt.args...), confine(h)...)...)...))
	for _, c := range checks {
		waitPass(t, serveTimeout, fmt.Sprintf("%s %s check %q to pass", c.provider, c.typ, c.name), c.run)
	}
	if out, err := n.verifiedProbe(jt.addr, certs); err != nil || out != "SERVING" {
		t.Errorf("a client verifying the certificate against the CA: %v: %s", err, out)
	}
	assertControlGuarded(t, n, d, h, certs)
	floodUnderTheLimit(t, n, d, cg, jt.addr)
	for _, c := range checks {
		waitPass(t, serveTimeout, fmt.Sprintf("%s check %q after the floods", c.typ, c.name), c.run)
	}
	for _, tm := range templates {
		renewNomadTemplate(t, n, d, jt.addr, tm, checks)
	}

	stopAt := time.Now()
	d.signal(killSignal)
	d.waitExit(killTimeout, "kill_timeout")
	t.Logf("stopped %v after %v", time.Since(stopAt).Round(time.Millisecond), killSignal)
}

// nomadTask is a job file's task as a Nomad client would run it on the
// test's node: the blocks read, the runtime variables filled (ev), the
// task's directory, its port's address, its args and env.
type nomadTask struct {
	ev            nomadEval
	group, task   *hclsyntax.Body
	taskDir, addr string
	args, env     []string
}

// readNomadTask reads the job "phasegate" of file: a system job whose
// group has a static port "api" and whose raw_exec task runs the
// production binary; it fills Nomad's runtime variables with the node's
// values and builds the task's args and env.
func readNomadTask(t *testing.T, n *node, file string) *nomadTask {
	t.Helper()
	job := block(t, hclBody(t, file), "job", "phasegate")
	jt := &nomadTask{
		ev:      nomadEval{t: t, vars: map[string]cty.Value{}},
		taskDir: t.TempDir(), // the task's working directory: secrets/, local/
	}
	ev := jt.ev
	if s := ev.str(job, "type", "service"); s != "system" {
		t.Errorf("job type %q: a node daemon is a system job", s)
	}
	jt.group = block(t, job, "group", "phasegate")
	static, ok := ev.value(block(t, block(t, jt.group, "network"), "port", "api"), "static")
	if !ok {
		t.Fatal(`port "api" has no static port: the daemon's port must be the same on every node`)
	}
	port, _ := static.AsBigFloat().Int64()
	jt.addr = net.JoinHostPort(n.ip.String(), strconv.FormatInt(port, 10))
	for k, v := range map[string]string{
		"NOMAD_IP_api":      n.ip.String(),
		"NOMAD_PORT_api":    strconv.FormatInt(port, 10),
		"NOMAD_ADDR_api":    jt.addr,
		"NOMAD_SECRETS_DIR": filepath.Join(jt.taskDir, "secrets"),
		"NOMAD_TASK_DIR":    filepath.Join(jt.taskDir, "local"),
	} {
		ev.vars[k] = cty.StringVal(v)
	}

	jt.task = block(t, jt.group, "task", "phasegate")
	if d := ev.str(jt.task, "driver", ""); d != "raw_exec" {
		t.Errorf("driver %q: the daemon needs the host's network namespace and mounts (raw_exec)", d)
	}
	config := block(t, jt.task, "config")
	if c := ev.str(config, "command", ""); c != productionBinary {
		t.Fatalf("command %q: the test runs the binary under test in place of %s", c, productionBinary)
	}
	argsVal, ok := ev.value(config, "args")
	if !ok {
		t.Fatal("config has no args")
	}
	for _, v := range argsVal.AsValueSlice() {
		jt.args = append(jt.args, v.AsString())
	}
	jt.env = baseEnv()
	for k, v := range ev.vars {
		jt.env = append(jt.env, k+"="+v.AsString())
	}
	for _, e := range blocks(jt.task, "env") {
		for name := range e.Attributes {
			jt.env = append(jt.env, name+"="+ev.str(e, name, ""))
		}
	}
	return jt
}

// nomadTemplate is one of the task's templates: where it renders, with
// what mode, how a change reaches the task, and what it renders from a
// set of certificates.
type nomadTemplate struct {
	path                     string
	perm                     os.FileMode
	changeMode, changeSignal string
	issue                    func(*testcerts.Set) []byte
}

// templates reads the task's templates: what Vault's pki engine would
// issue is what the test's CA issues, written where the template renders
// it.
func (jt *nomadTask) templates(t *testing.T) []nomadTemplate {
	t.Helper()
	ev := jt.ev
	var templates []nomadTemplate
	for _, tb := range blocks(jt.task, "template") {
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
		templates = append(templates, nomadTemplate{
			path:         filepath.Join(jt.taskDir, dest),
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
	return templates
}

// checkBudgets checks the task against the daemon's resolved settings r
// (TLS, its port, kill_timeout beyond its stop budget and within Nomad's
// cap, no task shutdown_delay beside services) and returns the task's
// kill signal and timeout.
func (jt *nomadTask) checkBudgets(t *testing.T, r resolved) (syscall.Signal, time.Duration) {
	t.Helper()
	ev, task := jt.ev, jt.task
	if !r.TLS {
		t.Errorf("the job serves %s without TLS", r.Listen)
	}
	if r.Listen != jt.addr {
		t.Errorf("the daemon listens on %s, the job's port is %s", r.Listen, jt.addr)
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

	if _, ok := task.Attributes["shutdown_delay"]; ok && len(blocks(jt.group, "service")) > 0 {
		t.Error("shutdown_delay on the task: Nomad deregisters the group's services before a kill only for the group's shutdown_delay")
	}
	return killSignal, killTimeout
}

// serviceChecks returns the group's service checks as their provider runs
// them, each service on the port labelled api and each check_restart's
// grace beyond the daemon's start budget.
func (jt *nomadTask) serviceChecks(t *testing.T, n *node, r resolved) []nomadCheck {
	t.Helper()
	ev := jt.ev
	var checks []nomadCheck
	for _, svc := range blocks(jt.group, "service") {
		provider := ev.str(svc, "provider", "consul")
		if p := ev.str(svc, "port", ""); p != "api" {
			t.Errorf("service port %q, want the label api", p)
		}
		for _, chk := range blocks(svc, "check") {
			checks = append(checks, nomadServiceCheck(t, n, ev, provider, chk, jt.addr))
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
	return checks
}

// memoryLimit is the task's memory limit in bytes, as Nomad's executor
// sets it (memory_max, else memory, in MiB) on the task's cgroup.
func (jt *nomadTask) memoryLimit(t *testing.T) int64 {
	t.Helper()
	res := block(t, jt.task, "resources")
	mem, ok := jt.ev.value(res, "memory_max")
	if !ok {
		if mem, ok = jt.ev.value(res, "memory"); !ok {
			t.Fatal("the task has no resources.memory: the test floods the port under it")
		}
	}
	mib, _ := mem.AsBigFloat().Int64()
	return mib << 20
}

// renewNomadTemplate renews a certificate as a template with change_mode
// signal does (re-render, then its change_signal) and checks that the
// same daemon serves the new certificate and passes every check again.
func renewNomadTemplate(t *testing.T, n *node, d *daemon, addr string, tm nomadTemplate, checks []nomadCheck) {
	t.Helper()
	if tm.changeMode != "signal" {
		t.Logf("template %s: change_mode %s (not exercised)", tm.path, tm.changeMode)
		return
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
