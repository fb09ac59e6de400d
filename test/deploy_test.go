package test

import (
	"bufio"
	"context"
	"flag"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"
)

// serveArgs are the serve flags a deployment file passes, parsed the way
// the daemon parses them (defaults as the daemon's).
type serveArgs struct {
	listen                  string
	drainDelay, stopTimeout time.Duration
	stateDir                string
}

func parseServeArgs(t *testing.T, args []string) serveArgs {
	t.Helper()
	if len(args) == 0 || args[0] != "serve" {
		t.Fatalf("deployment does not run `phasegate serve`: %q", args)
	}
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	a := serveArgs{}
	fs.StringVar(&a.listen, "listen", "127.0.0.1:5008", "")
	fs.DurationVar(&a.drainDelay, "drain-delay", 5*time.Second, "")
	fs.DurationVar(&a.stopTimeout, "stop-timeout", 10*time.Second, "")
	fs.StringVar(&a.stateDir, "state-dir", "/run/phasegate", "")
	fs.String("netns-dir", "", "")
	if err := fs.Parse(args[1:]); err != nil {
		t.Fatalf("deployment passes flags the test does not know (add them here if the daemon has them): %v", err)
	}
	// The binary is the judge of whether the flags exist.
	out, err := runBinary(append([]string{"serve"}, append(args[1:], "-h")...)...)
	if err != nil || !strings.Contains(out, "usage: phasegate serve") {
		t.Fatalf("phasegate serve rejects the deployment's flags: %v\n%s", err, out)
	}
	return a
}

func runBinary(args ...string) (string, error) {
	out, err := exec.Command(binary, args...).CombinedOutput()
	return string(out), err
}

// daemonEndpoints starts a daemon and returns a function that says whether
// an HTTP path and a gRPC health service exist on it (any answer but 404 /
// NOT_FOUND).
func daemonEndpoints(t *testing.T) (httpOK func(path string) bool, grpcOK func(service string) bool) {
	h := newHost(t)
	addr := freePort(t)
	d := start(t, nil, h.args(addr)...)
	d.waitServing(time.Minute)
	conn := dial(t, addr)
	return func(path string) bool {
			code, _, err := d.get(path)
			return err == nil && (code == http.StatusOK || code == http.StatusServiceUnavailable)
		}, func(service string) bool {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
			return err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING
		}
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

// attr evaluates an attribute with Nomad's runtime variables left as text.
func attr(t *testing.T, b *hclsyntax.Body, name string) cty.Value {
	t.Helper()
	a, ok := b.Attributes[name]
	if !ok {
		t.Fatalf("attribute %s missing", name)
	}
	v, diags := a.Expr.Value(&hcl.EvalContext{Variables: map[string]cty.Value{
		"NOMAD_IP_api": cty.StringVal("127.0.0.1"),
	}})
	if diags.HasErrors() {
		t.Fatalf("attribute %s: %v", name, diags)
	}
	return v
}

func str(t *testing.T, b *hclsyntax.Body, name string) string { return attr(t, b, name).AsString() }

func dur(t *testing.T, s string) time.Duration {
	t.Helper()
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestDeploymentFilesMatchTheDaemon(t *testing.T) {
	httpOK, grpcOK := daemonEndpoints(t)

	for _, tc := range []struct {
		file      string
		provider  string
		checkType string
	}{
		{"../deploy/nomad/phasegate.nomad.hcl", "nomad", "http"},
		{"../deploy/nomad/phasegate-consul.nomad.hcl", "consul", "grpc"},
	} {
		t.Run(tc.file, func(t *testing.T) {
			job := block(t, hclBody(t, tc.file), "job", "phasegate")
			if str(t, job, "type") != "system" {
				t.Error("not a system job")
			}
			group := block(t, job, "group")
			static := attr(t, block(t, block(t, group, "network"), "port", "api"), "static")
			port := static.AsBigFloat().String()
			task := block(t, group, "task", "phasegate")
			var args []string
			for _, v := range attr(t, block(t, task, "config"), "args").AsValueSlice() {
				args = append(args, v.AsString())
			}
			a := parseServeArgs(t, args)
			if !strings.HasSuffix(a.listen, ":"+port) {
				t.Errorf("daemon listens on %s, the job's port is %s", a.listen, port)
			}
			if kt := dur(t, str(t, task, "kill_timeout")); kt < a.drainDelay+a.stopTimeout {
				t.Errorf("kill_timeout %v < drain delay %v + stop timeout %v", kt, a.drainDelay, a.stopTimeout)
			}
			svc := block(t, group, "service")
			if str(t, svc, "provider") != tc.provider || str(t, svc, "port") != "api" {
				t.Errorf("service provider/port: %s/%s", str(t, svc, "provider"), str(t, svc, "port"))
			}
			var sawType bool
			for _, chk := range blocks(svc, "check") {
				switch typ := str(t, chk, "type"); typ {
				case "http":
					if p := str(t, chk, "path"); !httpOK(p) {
						t.Errorf("http check path %s is not served by the daemon", p)
					}
				case "grpc":
					if tc.provider == "nomad" {
						t.Error("Nomad's native provider cannot run grpc checks")
					}
					if s := str(t, chk, "grpc_service"); !grpcOK(s) {
						t.Errorf("grpc_service %q is not SERVING on the daemon", s)
					}
				default:
					t.Errorf("check type %s", typ)
				}
				if str(t, chk, "type") == tc.checkType {
					sawType = true
				}
				if cr := blocks(chk, "check_restart"); len(cr) == 1 {
					if g := dur(t, str(t, cr[0], "grace")); g < 5*time.Minute {
						t.Errorf("check_restart grace %v is too short for a slow reclaim", g)
					}
				}
			}
			if !sawType {
				t.Errorf("no %s check", tc.checkType)
			}
		})
	}

	t.Run("systemd", func(t *testing.T) {
		unit := parseUnit(t, "../deploy/systemd/phasegate.service")
		if unit["Type"] != "notify" {
			t.Errorf("Type=%s, want notify", unit["Type"])
		}
		exec := strings.Fields(unit["ExecStart"])
		a := parseServeArgs(t, exec[1:])
		if ts := dur(t, unit["TimeoutStopSec"]); ts < a.drainDelay+a.stopTimeout {
			t.Errorf("TimeoutStopSec %v < drain delay + stop timeout %v", ts, a.drainDelay+a.stopTimeout)
		}
		if unit["RuntimeDirectory"] != strings.TrimPrefix(a.stateDir, "/run/") {
			t.Errorf("RuntimeDirectory=%s but --state-dir=%s", unit["RuntimeDirectory"], a.stateDir)
		}
	})

	t.Run("kubernetes", func(t *testing.T) {
		src, err := os.ReadFile("../deploy/kubernetes/daemonset.yaml")
		if err != nil {
			t.Fatal(err)
		}
		var ds appsv1.DaemonSet
		if err := yaml.UnmarshalStrict(src, &ds); err != nil {
			t.Fatalf("not a valid DaemonSet: %v", err)
		}
		c := ds.Spec.Template.Spec.Containers[0]
		a := parseServeArgs(t, c.Args)
		_, port, _ := strings.Cut(a.listen, ":")
		sp, rp, lp := c.StartupProbe, c.ReadinessProbe, c.LivenessProbe
		switch {
		case sp == nil || sp.HTTPGet == nil || !httpOK(sp.HTTPGet.Path) || sp.HTTPGet.Path != "/startupz":
			t.Errorf("startupProbe %+v, want HTTP /startupz", sp)
		case sp.HTTPGet.Port.String() != port:
			t.Errorf("startupProbe port %s, daemon listens on %s", sp.HTTPGet.Port.String(), port)
		case time.Duration(sp.PeriodSeconds*sp.FailureThreshold)*time.Second < 5*time.Minute:
			t.Errorf("startupProbe budget %ds is too short for a slow reclaim", sp.PeriodSeconds*sp.FailureThreshold)
		}
		if rp == nil || rp.GRPC == nil || rp.GRPC.Service == nil || !grpcOK(*rp.GRPC.Service) || strconv.Itoa(int(rp.GRPC.Port)) != port {
			t.Errorf("readinessProbe %+v, want gRPC on %s", rp, port)
		}
		if lp == nil || lp.HTTPGet == nil || lp.HTTPGet.Path != "/livez" || !httpOK(lp.HTTPGet.Path) {
			t.Errorf("livenessProbe %+v, want HTTP /livez", lp)
		}
		if g := ds.Spec.Template.Spec.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second < a.drainDelay+a.stopTimeout {
			t.Errorf("terminationGracePeriodSeconds %v < drain delay + stop timeout", g)
		}
	})
}

// parseUnit reads the [Service] section of a systemd unit.
func parseUnit(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]string{}
	section := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "["):
			section = line
		case section == "[Service]":
			k, v, ok := strings.Cut(line, "=")
			if !ok {
				t.Fatalf("bad line %q", line)
			}
			out[k] = v
		}
	}
	return out
}
