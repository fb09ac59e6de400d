package test

// The deployment files are tested by running them. Each test reads its
// file, fills the platform's placeholders from a node it makes (a network
// namespace with an address of its own, see node), writes the TLS files the
// file names, starts the daemon with exactly the file's command line and
// environment, probes it until it serves the way the file's own checks
// would, then stops it with the file's signal and requires an orderly exit
// within the file's stop timeout. The arithmetic between the files'
// timeouts and the daemon's own budgets is checked against `phasegate
// serve <the file's arguments> --check`, the daemon's verdict.
//
// What the tests change, and nothing else:
//   - confine's four flags, appended to the file's (netns directory, slot
//     prefix, state directory, slot network: the host's own slots are not
//     the test's to touch);
//   - the binary's path (/usr/local/bin/phasegate, or the image's
//     entrypoint) is the binary under test;
//   - Kubernetes' Secret mount path, a fixed path in the container, is a
//     temporary directory: kubeRewrite replaces the mount path in the
//     arguments. Nomad's files need no rewrite: their paths are built from
//     NOMAD_SECRETS_DIR, a placeholder the test fills.

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"fmt"
	"net"
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

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/phasegate/phasegate/app"
	"github.com/phasegate/phasegate/internal/testcerts"
)

// productionBinary is where the files install the daemon.
const productionBinary = "/usr/local/bin/phasegate"

// serveTimeout bounds how long a test waits for the daemon (built with
// -race, on a shared 2-core machine) to pass its checks.
const serveTimeout = 2 * time.Minute

func runBinary(args ...string) (string, error) {
	out, err := exec.Command(binary, args...).CombinedOutput()
	return string(out), err
}

// waitPass polls f until it returns nil, and fails naming its last error.
func waitPass(t *testing.T, timeout time.Duration, what string, f func() error) {
	t.Helper()
	var last error
	deadline := time.Now().Add(timeout)
	for {
		if last = f(); last == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s; last: %v", timeout, what, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// signalNamed parses a signal name as the files write it ("SIGTERM").
func signalNamed(t *testing.T, name string) syscall.Signal {
	t.Helper()
	s := unix.SignalNum(strings.ToUpper(name))
	if s == 0 {
		t.Fatalf("unknown signal %q", name)
	}
	return s
}

// ---- Nomad ----

// nomadMaxKillTimeout is a Nomad client's default max_kill_timeout: every
// task's kill_timeout is capped at it.
const nomadMaxKillTimeout = 30 * time.Second

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

	d := n.start(addr, n.command(env, append(append([]string{binary}, args...), confine(h)...)...))
	for _, c := range checks {
		waitPass(t, serveTimeout, fmt.Sprintf("%s %s check %q to pass", c.provider, c.typ, c.name), c.run)
	}
	if out, err := n.verifiedProbe(addr, certs); err != nil || out != "SERVING" {
		t.Errorf("a client verifying the certificate against the CA: %v: %s", err, out)
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
				t.Fatalf("the daemon exited on %s: %v", tm.changeSignal, d.err)
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

// ---- Kubernetes ----

func TestDeployKubernetes(t *testing.T) {
	src, err := os.ReadFile("../deploy/kubernetes/daemonset.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var ds appsv1.DaemonSet
	if err := yaml.UnmarshalStrict(src, &ds); err != nil {
		t.Fatalf("not a valid DaemonSet: %v", err)
	}
	spec := ds.Spec.Template.Spec
	if !spec.HostNetwork {
		t.Error("hostNetwork is false: the slots are the node's, and status.podIP must be the node's address")
	}
	if len(spec.Containers) != 1 || spec.Containers[0].Name != "phasegate" {
		t.Fatalf("want one container, phasegate: %d", len(spec.Containers))
	}
	c := spec.Containers[0]
	if len(c.Command) != 0 {
		t.Fatalf("command %q replaces the image's entrypoint; the test runs args with the binary under test", c.Command)
	}
	n := newNode(t)
	h := newHost(t)
	certs := newCerts(t)

	env, envList := kubeEnv(t, c, n)
	// Secret volumes: a kubernetes.io/tls Secret's keys, in a directory
	// that stands in for the mount path.
	rewrite := map[string]string{}
	for _, m := range c.VolumeMounts {
		v := kubeVolume(t, spec, m.Name)
		if v.Secret == nil {
			continue
		}
		if !m.ReadOnly {
			t.Errorf("Secret %s is mounted read-write", v.Secret.SecretName)
		}
		dir := t.TempDir()
		rewrite[m.MountPath] = dir
		keys := map[string][]byte{
			corev1.TLSCertKey:       append(pemFile(t, certs.ServerCert), pemFile(t, certs.CAFile)...),
			corev1.TLSPrivateKeyKey: pemFile(t, certs.ServerKey),
		}
		paths := map[string]string{corev1.TLSCertKey: corev1.TLSCertKey, corev1.TLSPrivateKeyKey: corev1.TLSPrivateKeyKey}
		if len(v.Secret.Items) > 0 {
			paths = map[string]string{}
			for _, it := range v.Secret.Items {
				paths[it.Key] = it.Path
			}
		}
		for key, p := range paths {
			data, ok := keys[key]
			if !ok {
				t.Fatalf("Secret %s key %q: a kubernetes.io/tls Secret has %s and %s", v.Secret.SecretName, key, corev1.TLSCertKey, corev1.TLSPrivateKeyKey)
			}
			writeFile(t, filepath.Join(dir, p), data, 0o400)
		}
	}
	var args []string
	for _, a := range c.Args {
		args = append(args, kubeRewrite(kubeExpand(a, env), rewrite))
	}

	r := n.check(envList, args)
	if !r.TLS {
		t.Errorf("the DaemonSet serves %s without TLS", r.Listen)
	}
	// What must outlive the pod, or be shared with the host, is on the
	// host: the netns files (propagated both ways), the records, the lock.
	for _, dir := range []string{r.NetnsDir, r.StateDir, filepath.Dir(r.Lock)} {
		m := kubeHostMount(t, spec, c, dir)
		if m == nil {
			t.Errorf("%s is not a hostPath mount of the same path: it dies with the container, or the host does not see it", dir)
		} else if dir == r.NetnsDir && (m.MountPropagation == nil || *m.MountPropagation != corev1.MountPropagationBidirectional) {
			t.Errorf("%s: mountPropagation must be Bidirectional, so that namespaces mounted in the container are seen by the host", dir)
		}
	}
	grace := 30 * time.Second // Kubernetes' default
	if g := spec.TerminationGracePeriodSeconds; g != nil {
		grace = time.Duration(*g) * time.Second
	}
	if grace <= r.stopBudget() {
		t.Errorf("terminationGracePeriodSeconds %v does not exceed the daemon's stop budget %v: the kubelet would SIGKILL an orderly stop", grace, r.stopBudget())
	}
	sp, rp, lp := c.StartupProbe, c.ReadinessProbe, c.LivenessProbe
	if sp == nil || rp == nil || lp == nil {
		t.Fatal("startupProbe, readinessProbe and livenessProbe are all needed")
	}
	if b := time.Duration(sp.InitialDelaySeconds+sp.PeriodSeconds*sp.FailureThreshold) * time.Second; b < r.startBudget(t) {
		t.Errorf("startupProbe budget %v < --start-timeout plus the stop budget (%v): the kubelet would kill a start the daemon still bounds itself", b, r.startBudget(t))
	}
	if u := ds.Spec.UpdateStrategy.RollingUpdate; u == nil || u.MaxSurge == nil || u.MaxSurge.IntVal != 0 || (u.MaxSurge.StrVal != "" && u.MaxSurge.StrVal != "0%") {
		t.Error("updateStrategy.rollingUpdate.maxSurge must be 0: a surge pod finds the port and the lock taken and never becomes ready")
	}

	addr := r.Listen
	d := n.start(addr, n.command(envList, append(append([]string{binary}, args...), confine(h)...)...))
	// The kubelet runs the startup probe until it passes, then the others.
	waitPass(t, serveTimeout, "the startupProbe to pass", func() error { return kubeletProbe(n, c, sp) })
	waitPass(t, serveTimeout, "the readinessProbe to pass", func() error { return kubeletProbe(n, c, rp) })
	waitPass(t, serveTimeout, "the livenessProbe to pass", func() error { return kubeletProbe(n, c, lp) })
	if out, err := n.verifiedProbe(addr, certs); err != nil || out != "SERVING" {
		t.Errorf("a client verifying the certificate against the CA: %v: %s", err, out)
	}

	stop := syscall.SIGTERM
	if c.Lifecycle != nil && c.Lifecycle.StopSignal != nil {
		stop = signalNamed(t, string(*c.Lifecycle.StopSignal))
	}
	t.Logf("stop budget %v, terminationGracePeriodSeconds %v; start budget %v", r.stopBudget(), grace, r.startBudget(t))
	stopAt := time.Now()
	d.signal(stop)
	d.waitExit(grace, "terminationGracePeriodSeconds")
	t.Logf("stopped %v after %v", time.Since(stopAt).Round(time.Millisecond), stop)
}

// kubeEnv is the container's environment as the kubelet makes it, with the
// downward API's fields from the node: status.podIP and status.hostIP are
// the node's address (hostNetwork).
func kubeEnv(t *testing.T, c corev1.Container, n *node) (map[string]string, []string) {
	t.Helper()
	if len(c.EnvFrom) > 0 {
		t.Fatal("envFrom is not emulated")
	}
	env := map[string]string{}
	list := baseEnv()
	for _, e := range c.Env {
		v := kubeExpand(e.Value, env)
		if e.ValueFrom != nil {
			if e.ValueFrom.FieldRef == nil {
				t.Fatalf("env %s: only fieldRef is emulated", e.Name)
			}
			switch p := e.ValueFrom.FieldRef.FieldPath; p {
			case "status.podIP", "status.hostIP":
				v = n.ip.String()
			default:
				t.Fatalf("env %s: fieldRef %s is not emulated", e.Name, p)
			}
		}
		env[e.Name] = v
		list = append(list, e.Name+"="+v)
	}
	return env, list
}

// kubeExpand expands $(VAR) the way the kubelet does in args: a defined
// variable is replaced, $$ is a literal $, an undefined reference stays.
func kubeExpand(s string, env map[string]string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i:], ')')
			if end < 0 {
				b.WriteString(s[i:])
				return b.String()
			}
			name := s[i+2 : i+end]
			if v, ok := env[name]; ok {
				b.WriteString(v)
			} else {
				b.WriteString(s[i : i+end+1])
			}
			i += end
		default:
			b.WriteByte('$')
		}
	}
	return b.String()
}

// kubeRewrite replaces, in one argument, a mount path the test stands in
// for by its directory: the container sees /etc/phasegate/tls/tls.crt, the
// test's daemon <tmp>/tls.crt.
func kubeRewrite(arg string, rewrite map[string]string) string {
	for from, to := range rewrite {
		arg = strings.ReplaceAll(arg, "="+from+"/", "="+to+"/")
	}
	return arg
}

func kubeVolume(t *testing.T, spec corev1.PodSpec, name string) corev1.Volume {
	t.Helper()
	for _, v := range spec.Volumes {
		if v.Name == name {
			return v
		}
	}
	t.Fatalf("volume %s is mounted but not declared", name)
	return corev1.Volume{}
}

// kubeHostMount returns the mount that puts dir on the host at the same
// path (a hostPath volume whose path is the mount path), or nil.
func kubeHostMount(t *testing.T, spec corev1.PodSpec, c corev1.Container, dir string) *corev1.VolumeMount {
	t.Helper()
	for i, m := range c.VolumeMounts {
		v := kubeVolume(t, spec, m.Name)
		if v.HostPath == nil || v.HostPath.Path != m.MountPath {
			continue
		}
		if dir == m.MountPath || strings.HasPrefix(dir, m.MountPath+"/") {
			return &c.VolumeMounts[i]
		}
	}
	return nil
}

// kubeletProbe runs one probe the way the kubelet does: httpGet on the pod
// IP (the node's, with hostNetwork) and the named or numbered port, HTTPS
// without verifying the certificate, success on 200–399; grpc in plain
// text (the kubelet's gRPC probe cannot do TLS), success on SERVING.
func kubeletProbe(n *node, c corev1.Container, p *corev1.Probe) error {
	timeout := time.Duration(p.TimeoutSeconds) * time.Second
	if timeout == 0 {
		timeout = time.Second
	}
	port := func(name string, num int32) string {
		if name == "" {
			return strconv.Itoa(int(num))
		}
		for _, cp := range c.Ports {
			if cp.Name == name {
				return strconv.Itoa(int(cp.ContainerPort))
			}
		}
		return "no-port-" + name
	}
	switch {
	case p.HTTPGet != nil:
		g := p.HTTPGet
		host := g.Host
		if host == "" {
			host = n.ip.String()
		}
		scheme := strings.ToLower(string(g.Scheme))
		if scheme == "" {
			scheme = "http"
		}
		url := scheme + "://" + net.JoinHostPort(host, port(g.Port.StrVal, g.Port.IntVal)) + g.Path
		code, err := n.httpGet(url, &tls.Config{InsecureSkipVerify: true}, timeout)
		if err != nil {
			return err
		}
		if code < 200 || code >= 400 {
			return fmt.Errorf("GET %s: %d", url, code)
		}
		return nil
	case p.GRPC != nil:
		service := ""
		if p.GRPC.Service != nil {
			service = *p.GRPC.Service
		}
		addr := net.JoinHostPort(n.ip.String(), strconv.Itoa(int(p.GRPC.Port)))
		st, err := n.grpcHealth(addr, service, insecure.NewCredentials(), timeout)
		if err != nil {
			return fmt.Errorf("gRPC probe (plain text, as the kubelet's): %w", err)
		}
		if st != healthpb.HealthCheckResponse_SERVING {
			return fmt.Errorf("gRPC probe: %v", st)
		}
		return nil
	}
	return fmt.Errorf("probe %+v is not emulated", p.ProbeHandler)
}

// ---- systemd ----

// unit is a parsed systemd unit file: section → key → values, in order
// (a key may repeat: Environment=).
type unit map[string]map[string][]string

func parseUnit(t *testing.T, path string) unit {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	u := unit{}
	section := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "["):
			section = strings.Trim(line, "[]")
			u[section] = map[string][]string{}
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" || strings.HasSuffix(line, `\`) {
				t.Fatalf("%s: line %q is not emulated", path, line)
			}
			k = strings.TrimSpace(k)
			u[section][k] = append(u[section][k], strings.TrimSpace(v))
		}
	}
	return u
}

// get is a key's value (the last, as systemd takes for single values).
func (u unit) get(section, key string) string {
	vs := u[section][key]
	if len(vs) == 0 {
		return ""
	}
	return vs[len(vs)-1]
}

// words splits a command line or an assignment list; the files use no
// quoting, which the test does not emulate.
func words(t *testing.T, s string) []string {
	t.Helper()
	if strings.ContainsAny(s, `"'\%`) {
		t.Fatalf("%q: quoting and specifiers are not emulated", s)
	}
	return strings.Fields(s)
}

// systemdTime parses a systemd time span: "30s", "5min 30s", "90" (seconds).
func systemdTime(t *testing.T, s string) time.Duration {
	t.Helper()
	units := map[string]time.Duration{
		"us": time.Microsecond, "ms": time.Millisecond, "": time.Second, "s": time.Second, "sec": time.Second,
		"m": time.Minute, "min": time.Minute, "h": time.Hour, "hr": time.Hour,
	}
	var total time.Duration
	for _, w := range strings.Fields(s) {
		i := strings.IndexFunc(w, func(r rune) bool { return r < '0' || r > '9' })
		if i < 0 {
			i = len(w)
		}
		n, err := strconv.Atoi(w[:i])
		u, ok := units[w[i:]]
		if err != nil || !ok {
			t.Fatalf("time span %q is not emulated", s)
		}
		total += time.Duration(n) * u
	}
	if total == 0 {
		t.Fatalf("time span %q: zero (or infinity) bounds nothing", s)
	}
	return total
}

// systemdService is what the tests take from the unit files.
type systemdService struct {
	svc, sock unit
	args      []string // ExecStart's arguments, after the binary
	env       []string // Environment=
	listen    string   // ListenStream=
	fdName    string   // FileDescriptorName=
	backlog   int      // Backlog=
}

func readSystemdUnits(t *testing.T) systemdService {
	t.Helper()
	s := systemdService{
		svc:  parseUnit(t, "../deploy/systemd/phasegate.service"),
		sock: parseUnit(t, "../deploy/systemd/phasegate.socket"),
	}
	exec := words(t, s.svc.get("Service", "ExecStart"))
	if len(exec) < 2 || exec[0] != productionBinary {
		t.Fatalf("ExecStart %q: the test runs the binary under test in place of %s", exec, productionBinary)
	}
	s.args = exec[1:]
	for _, e := range s.svc["Service"]["Environment"] {
		s.env = append(s.env, words(t, e)...)
	}
	s.listen = s.sock.get("Socket", "ListenStream")
	s.fdName = s.sock.get("Socket", "FileDescriptorName")
	if b := s.sock.get("Socket", "Backlog"); b != "" {
		var err error
		if s.backlog, err = strconv.Atoi(b); err != nil || s.backlog <= 0 {
			t.Fatalf("Backlog=%s", b)
		}
	}
	return s
}

// verifyUnits runs systemd-analyze verify on copies of the unit files
// whose binary is the one under test, and fails on anything it says:
// systemd ignores what it does not know with a warning, and so would the
// test's own parser.
func verifyUnits(t *testing.T) {
	analyze := lookTool(t, "systemd-analyze", "apt-get install systemd")
	dir := t.TempDir()
	var paths []string
	for _, name := range []string{"phasegate.socket", "phasegate.service"} {
		src := pemFile(t, filepath.Join("../deploy/systemd", name))
		p := filepath.Join(dir, name)
		writeFile(t, p, bytes.ReplaceAll(src, []byte(productionBinary), []byte(binary)), 0o644)
		paths = append(paths, p)
	}
	out, err := exec.Command(analyze, append([]string{"verify"}, paths...)...).CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
}

// TestDeploySystemd runs the service unit's ExecStart the way systemd
// would with the socket unit: under systemd-socket-activate with the
// socket's address and descriptor name, with the unit's environment, and
// the test playing the service manager's end of sd_notify (NOTIFY_SOCKET,
// WATCHDOG_USEC from WatchdogSec). It checks the port listens before the
// daemon runs and is served by the daemon after, READY=1 and the start
// budget the daemon asks for, a reload (ExecReload, the in-place upgrade)
// that keeps the pid and refuses no connection with WATCHDOG=1 never
// further apart than WatchdogSec, and an orderly stop within
// TimeoutStopSec.
func TestDeploySystemd(t *testing.T) {
	activate := lookTool(t, "systemd-socket-activate", "apt-get install systemd")
	verifyUnits(t)
	u := readSystemdUnits(t)
	if u.svc.get("Service", "Type") != "notify" {
		t.Errorf("Type=%s, want notify: started must mean serving", u.svc.get("Service", "Type"))
	}
	if a := u.svc.get("Service", "NotifyAccess"); a != "main" && a != "all" {
		t.Errorf("NotifyAccess=%q: the daemon's notifications would be dropped", a)
	}
	for _, k := range []string{"Requires", "After"} {
		if !strings.Contains(" "+strings.Join(u.svc["Unit"][k], " ")+" ", " phasegate.socket ") {
			t.Errorf("%s= does not name phasegate.socket", k)
		}
	}
	if u.fdName != app.ListenFDName {
		t.Errorf("FileDescriptorName=%q, the daemon looks for %q", u.fdName, app.ListenFDName)
	}
	if u.backlog == 0 {
		t.Error("no Backlog=: connections made while no daemon accepts wait in it")
	}
	if p := u.svc.get("Service", "RuntimeDirectoryPreserve"); p != "yes" {
		t.Errorf("RuntimeDirectoryPreserve=%q: a stop would delete the leases' records while their slots live on", p)
	}
	if km := u.svc.get("Service", "KillMode"); km == "none" {
		t.Error("KillMode=none leaves a stuck daemon running")
	}
	reload := words(t, u.svc.get("Service", "ExecReload"))
	if len(reload) != 3 || reload[0] != "/bin/kill" || reload[1] != "-HUP" || reload[2] != "$MAINPID" {
		t.Fatalf("ExecReload=%q, want /bin/kill -HUP $MAINPID (the in-place upgrade)", reload)
	}

	n := newNode(t)
	h := newHost(t)
	env := append(baseEnv(), u.env...)
	r := n.check(env, u.args)
	if r.Listen != u.listen {
		t.Errorf("ListenStream=%s but --listen=%s", u.listen, r.Listen)
	}
	if rd := u.svc.get("Service", "RuntimeDirectory"); "/run/"+rd != r.StateDir {
		t.Errorf("RuntimeDirectory=%s but --state-dir=%s", rd, r.StateDir)
	}
	stopTimeout := systemdTime(t, u.svc.get("Service", "TimeoutStopSec"))
	if stopTimeout <= r.stopBudget() {
		t.Errorf("TimeoutStopSec %v does not exceed the daemon's stop budget %v: systemd would SIGKILL an orderly stop", stopTimeout, r.stopBudget())
	}
	startTimeout := systemdTime(t, u.svc.get("Service", "TimeoutStartSec"))
	if startTimeout < r.startBudget(t) {
		t.Errorf("TimeoutStartSec %v < --start-timeout plus the stop budget (%v): systemd would kill a start the daemon still bounds itself", startTimeout, r.startBudget(t))
	}
	watchdog := systemdTime(t, u.svc.get("Service", "WatchdogSec"))
	killSignal := syscall.SIGTERM
	if s := u.svc.get("Service", "KillSignal"); s != "" {
		killSignal = signalNamed(t, s)
	}

	notify := newNotifySocket(t)
	cmd := []string{activate, "-l", u.listen, "--fdname=" + u.fdName,
		"-E", "NOTIFY_SOCKET=" + notify.path,
		"-E", fmt.Sprintf("WATCHDOG_USEC=%d", watchdog.Microseconds())}
	for _, e := range env {
		cmd = append(cmd, "-E", e)
	}
	cmd = append(append(append(cmd, binary), u.args...), confine(h)...)
	d := n.start(u.listen, n.command(baseEnv(), cmd...))

	// The socket listens while the process is still systemd-socket-activate:
	// no connection has come, so it has not executed the daemon yet.
	waitPass(t, time.Minute, "the activation socket to listen", func() error {
		if !d.running() {
			t.Fatalf("systemd-socket-activate exited: %v", d.err)
		}
		return n.listening(d.cmd.Process.Pid, u.listen)
	})
	if exe, want := d.exe(), mustEval(t, activate); exe != want {
		t.Fatalf("before the first connection the process runs %s, want %s", exe, want)
	}
	// The first connection starts the daemon, which answers it.
	resp, err := rawGet(n, u.listen, "/livez")
	if err != nil || !strings.HasPrefix(resp, "HTTP/1.1 200") {
		t.Fatalf("the first connection, made before the daemon ran: %v %q", err, resp)
	}
	if exe, want := d.exe(), mustEval(t, binary); exe != want {
		t.Errorf("after the first connection the process runs %s, want the daemon %s", exe, want)
	}

	notify.next(t, 0, "READY", serveTimeout)
	ext := notify.all(0, "EXTEND_TIMEOUT_USEC")
	extend := "none"
	if len(ext) == 0 {
		t.Error("no EXTEND_TIMEOUT_USEC while starting")
	} else {
		extend = ext[0].fields["EXTEND_TIMEOUT_USEC"] + "µs"
	}
	for _, m := range ext {
		if v := usec(t, m.fields["EXTEND_TIMEOUT_USEC"]); v <= 0 || v > r.startBudget(t) || v > startTimeout {
			t.Errorf("EXTEND_TIMEOUT_USEC=%v: want within (0, start budget %v] and within TimeoutStartSec %v", v, r.startBudget(t), startTimeout)
		}
	}
	waitPass(t, serveTimeout, "the daemon to serve on the activated socket", func() error {
		code, err := n.httpGet("http://"+u.listen+"/readyz", nil, 2*time.Second)
		if err == nil && code != 200 {
			err = fmt.Errorf("/readyz %d", code)
		}
		return err
	})
	if st, err := n.grpcHealth(u.listen, "", insecure.NewCredentials(), 5*time.Second); err != nil || st != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("grpc health: %v %v", st, err)
	}
	if strings.Contains(d.logs.String(), "address already in use") {
		t.Errorf("the daemon bound its own socket:\n%s", d.logs.String())
	}
	notify.next(t, 0, "WATCHDOG", watchdog)

	// systemctl reload: ExecReload with $MAINPID, the daemon's pid.
	pid := d.cmd.Process.Pid
	from := notify.count()
	reloadAt := time.Now()
	refused := watchRefusals(n, u.listen)
	run(t, reload[0], reload[1], strconv.Itoa(pid))
	notify.next(t, from, "READY", serveTimeout)
	notify.next(t, from, "WATCHDOG", watchdog)
	if n := refused(); n > 0 {
		t.Errorf("%d connections refused during the reload", n)
	}
	if !d.running() || d.cmd.Process.Pid != pid {
		t.Fatalf("the reload did not keep the process: %v", d.err)
	}
	// The gap systemd's watchdog sees: from the old image's last WATCHDOG=1
	// before the SIGHUP to the new image's first.
	var before, after time.Time
	for _, m := range notify.all(0, "WATCHDOG") {
		if m.at.Before(reloadAt) {
			before = m.at
		} else if after.IsZero() {
			after = m.at
		}
	}
	if before.IsZero() || after.IsZero() {
		t.Fatalf("no WATCHDOG=1 on one side of the reload (before %v, after %v)", before, after)
	}
	widest := after.Sub(before)
	if widest >= watchdog {
		t.Errorf("WATCHDOG=1 %v apart across the reload, WatchdogSec=%v: systemd would kill the daemon", widest, watchdog)
	}
	t.Logf("reload: READY=1 again %v after SIGHUP, same pid, no connection refused, WATCHDOG=1 gap across it %v (WatchdogSec %v)",
		time.Since(reloadAt).Round(time.Millisecond), widest.Round(time.Millisecond), watchdog)

	from = notify.count()
	stopAt := time.Now()
	d.signal(killSignal)
	d.waitExit(stopTimeout, "TimeoutStopSec")
	t.Logf("stop budget %v, TimeoutStopSec %v, stopped in %v; start budget %v, TimeoutStartSec %v, EXTEND_TIMEOUT_USEC %s",
		r.stopBudget(), stopTimeout, time.Since(stopAt).Round(time.Millisecond), r.startBudget(t), startTimeout, extend)
	notify.next(t, from, "STOPPING", time.Second)
}

// TestDeploySystemdRestartKeepsThePort plays `systemctl restart` with the
// socket unit: the test holds the listening socket as systemd does (the
// unit's address and Backlog=), hands it to ExecStart as systemd would
// (LISTEN_FDS, LISTEN_PID, LISTEN_FDNAMES), stops the daemon with
// KillSignal and starts a new one on the same socket. No connection is
// refused meanwhile, and a request sent while no daemon runs is answered
// by the next.
func TestDeploySystemdRestartKeepsThePort(t *testing.T) {
	u := readSystemdUnits(t)
	n := newNode(t)
	h := newHost(t)
	if u.backlog == 0 {
		t.Fatal("no Backlog= in the socket unit")
	}
	sock := n.listen(u.listen, u.backlog)
	env := append(baseEnv(), u.env...)
	env = append(env, "LISTEN_FDS=1", "LISTEN_FDNAMES="+u.fdName)
	killSignal := syscall.SIGTERM
	if s := u.svc.get("Service", "KillSignal"); s != "" {
		killSignal = signalNamed(t, s)
	}
	stopTimeout := systemdTime(t, u.svc.get("Service", "TimeoutStopSec"))
	startService := func() *daemon {
		// systemd sets LISTEN_PID to the pid that execs ExecStart: the
		// shell's, which exec keeps.
		argv := append(append([]string{"/bin/sh", "-c", `LISTEN_PID=$$ exec "$0" "$@"`, binary}, u.args...), confine(h)...)
		cmd := n.command(env, argv...)
		cmd.ExtraFiles = []*os.File{sock}
		return n.start(u.listen, cmd)
	}
	serving := func(d *daemon) {
		waitPass(t, serveTimeout, "the daemon to serve", func() error {
			if !d.running() {
				t.Fatalf("the daemon exited: %v\n%s", d.err, d.logs.String())
			}
			code, err := n.httpGet("http://"+u.listen+"/readyz", nil, 2*time.Second)
			if err == nil && code != 200 {
				err = fmt.Errorf("/readyz %d", code)
			}
			return err
		})
	}

	d1 := startService()
	serving(d1)
	refused := watchRefusals(n, u.listen)
	stoppedAt := time.Now()
	d1.signal(killSignal)
	d1.waitExit(stopTimeout, "TimeoutStopSec")
	// No daemon runs: the connection is accepted by the kernel into the
	// socket's backlog, and the request waits there.
	pending, err := sendGet(n, u.listen, "/livez")
	if err != nil {
		t.Fatalf("connecting while no daemon runs: %v", err)
	}
	defer pending.Close()
	d2 := startService()
	serving(d2)
	t.Logf("restart: %v from SIGTERM to the next daemon serving", time.Since(stoppedAt).Round(time.Millisecond))
	if resp, err := readStatus(pending); err != nil || !strings.HasPrefix(resp, "HTTP/1.1 200") {
		t.Errorf("the request made between the two daemons: %v %q", err, resp)
	}
	if k := refused(); k > 0 {
		t.Errorf("%d connections refused during the restart", k)
	}
	d2.signal(killSignal)
	d2.waitExit(stopTimeout, "TimeoutStopSec")
}

// watchRefusals connects to addr from inside the node every 20 ms until
// the returned function is called, which returns how many connections
// failed.
func watchRefusals(n *node, addr string) func() int {
	var failed atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			ctx, cancel := contextTimeout(2 * time.Second)
			c, err := n.dial(ctx, "tcp", addr)
			cancel()
			if err != nil {
				failed.Add(1)
				continue
			}
			c.Close()
		}
	})
	return func() int {
		close(stop)
		wg.Wait()
		return int(failed.Load())
	}
}

// sendGet connects from inside the node and sends one HTTP/1.1 GET,
// without waiting for the answer: the connection may sit in a backlog
// until a daemon accepts it.
func sendGet(n *node, addr, path string) (net.Conn, error) {
	ctx, cancel := contextTimeout(10 * time.Second)
	defer cancel()
	c, err := n.dial(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	_ = c.SetDeadline(time.Now().Add(serveTimeout))
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: phasegate\r\nConnection: close\r\n\r\n", path); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// readStatus reads the status line of the answer on c.
func readStatus(c net.Conn) (string, error) {
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line), err
}

// rawGet is sendGet and readStatus on a connection of its own.
func rawGet(n *node, addr, path string) (string, error) {
	c, err := sendGet(n, addr, path)
	if err != nil {
		return "", err
	}
	defer c.Close()
	return readStatus(c)
}

// listening reports whether process pid is in the node's namespace (it
// starts as nsenter, in this machine's) and a TCP socket listens on addr
// there (its /proc/<pid>/net/tcp).
func (n *node) listening(pid int, addr string) error {
	var ns, own unix.Stat_t
	if err := unix.Stat(n.ns, &ns); err != nil {
		return err
	}
	if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &own); err != nil {
		return err
	}
	if own.Ino != ns.Ino || own.Dev != ns.Dev {
		return fmt.Errorf("process %d has not entered the node's namespace yet", pid)
	}
	_, port, _ := net.SplitHostPort(addr)
	p, _ := strconv.Atoi(port)
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/tcp", pid))
	if err != nil {
		return err
	}
	want := fmt.Sprintf(":%04X", p)
	for _, line := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) > 3 && strings.HasSuffix(f[1], want) && f[3] == "0A" { // 0A: LISTEN
			return nil
		}
	}
	return fmt.Errorf("nothing listens on %s", addr)
}

// mustEval resolves symlinks, as /proc/<pid>/exe shows a program.
func mustEval(t *testing.T, p string) string {
	t.Helper()
	r, err := filepath.EvalSymlinks(p)
	if err != nil {
		t.Fatal(err)
	}
	return r
}
