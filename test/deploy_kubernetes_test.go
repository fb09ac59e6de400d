package test

import (
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

	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/phasegate/phasegate/internal/testcerts"
)

// TestDeployKubernetes runs the DaemonSet's container on a node: its args
// expanded by the kubelet's rules with the downward API filled, the TLS
// Secret's keys where it is mounted, until the startup, readiness and
// liveness probes pass as the kubelet runs them; then SIGTERM, after which
// the daemon must exit 0 within terminationGracePeriodSeconds.
func TestDeployKubernetes(t *testing.T) {
	ds, spec, c := readDaemonSet(t)
	n := newNode(t)
	h := newHost(t)
	certs := newCerts(t)

	env, envList := kubeEnv(t, c, n)
	rewrite := mountTLSSecrets(t, spec, c, certs)
	var args []string
	for _, a := range c.Args {
		args = append(args, kubeRewrite(kubeExpand(a, env), rewrite))
	}

	r := n.check(envList, args)
	grace := checkDaemonSetBudgets(t, ds, spec, c, r)
	sp, rp, lp := c.StartupProbe, c.ReadinessProbe, c.LivenessProbe

	addr := r.Listen
	// The container's memory limit, as the runtime sets it: a cgroup.
	limit := c.Resources.Limits.Memory().Value()
	if limit == 0 {
		t.Fatal("the container has no memory limit (resources.limits.memory): the test floods the port under it")
	}
	cg := newMemoryCgroup(t, limit)
	d := n.start(addr, n.command(envList, cg.wrap(append(append([]string{binary}, args...), confine(h)...)...)...))
	// The kubelet runs the startup probe until it passes, then the others.
	waitPass(t, serveTimeout, "the startupProbe to pass", func() error { return kubeletProbe(n, c, sp) })
	waitPass(t, serveTimeout, "the readinessProbe to pass", func() error { return kubeletProbe(n, c, rp) })
	waitPass(t, serveTimeout, "the livenessProbe to pass", func() error { return kubeletProbe(n, c, lp) })
	if out, err := n.verifiedProbe(addr, certs); err != nil || out != "SERVING" {
		t.Errorf("a client verifying the certificate against the CA: %v: %s", err, out)
	}
	assertControlGuarded(t, n, d, h, certs)
	floodUnderTheLimit(t, n, d, cg, addr)
	waitPass(t, serveTimeout, "the livenessProbe to pass after the floods", func() error { return kubeletProbe(n, c, lp) })

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

// readDaemonSet reads deploy/kubernetes/daemonset.yaml strictly and
// returns it with its pod spec and its one container, phasegate, which
// runs on the host's network and keeps the image's entrypoint.
func readDaemonSet(t *testing.T) (appsv1.DaemonSet, corev1.PodSpec, corev1.Container) {
	t.Helper()
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
	return ds, spec, c
}

// mountTLSSecrets writes each Secret volume of the container, a
// kubernetes.io/tls Secret's keys from certs, into a directory that stands
// in for its mount path, and returns mount path → directory.
func mountTLSSecrets(t *testing.T, spec corev1.PodSpec, c corev1.Container, certs *testcerts.Set) map[string]string {
	t.Helper()
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
	return rewrite
}

// checkDaemonSetBudgets checks the DaemonSet against the daemon's resolved
// settings r: TLS, what must outlive the pod on hostPath mounts, the
// grace period beyond the stop budget, the startup probe's budget beyond
// the start budget, all three probes, no surge; it returns the grace
// period.
func checkDaemonSetBudgets(t *testing.T, ds appsv1.DaemonSet, spec corev1.PodSpec, c corev1.Container, r resolved) time.Duration {
	t.Helper()
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
	return grace
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
