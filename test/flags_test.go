package test

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/phasegate/phasegate/phases"
	"github.com/phasegate/phasegate/phases/lockfile"
)

func TestBadConfigurationExitsTwoAndTouchesNothing(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	tests := []struct {
		name string
		args []string
		env  []string
		want string // in the one line printed
	}{
		{"negative slots", []string{"--slots=-1"}, nil, "slots is -1"},
		{"negative pool size", []string{"--pool-size=-3"}, nil, "--pool-size is -3"},
		{"zero reclaim workers", []string{"--reclaim-workers=0"}, nil, "--reclaim-workers is 0"},
		{"negative port bound per peer", []string{"--port-conns-per-peer=-1"}, nil, "--port-conns-per-peer is -1"},
		{"min ready above pool", []string{"--pool-size=2", "--pool-min-ready=3"}, nil, "--pool-min-ready 3 is larger than --pool-size 2"},
		{"CIDR too small", []string{"--slots=1024", "--slot-cidr=169.254.0.0/24"}, nil, "169.254.0.0/24"},
		{"CIDR with host bits", []string{"--slot-cidr=169.254.0.1/17"}, nil, "host bits"},
		{"prefix too long", []string{"--slot-prefix=averyverylongpre-"}, nil, "IFNAMSIZ"},
		{"netns dir without parent", []string{"--netns-dir=/nonexistent-phasegate/a/netns"}, nil, "parent directory /nonexistent-phasegate/a does not exist"},
		{"relative netns dir", []string{"--netns-dir=netns"}, nil, "must be an absolute path"},
		{"port in use", []string{"--listen=" + busy.Addr().String()}, nil, "address already in use"},
		{"bad listen address", []string{"--listen=nonsense"}, nil, `--listen "nonsense"`},
		{"unknown flag", []string{"--slotz=3"}, nil, "flag provided but not defined: -slotz"},
		{"bad duration", []string{"--drain-delay=soon"}, nil, `invalid value "soon"`},
		{"bad log format", []string{"--log-format=xml"}, nil, "want one of text, json"},
		{"bad environment value", nil, []string{"PHASEGATE_POOL_GRACE=soon"}, `PHASEGATE_POOL_GRACE="soon"`},
		{"bad tracing exporter", nil, []string{"OTEL_TRACES_EXPORTER=zipkin"}, `OTEL_TRACES_EXPORTER="zipkin"`},
		{"non-loopback without TLS", []string{"--listen=0.0.0.0:5008"}, nil, "not a loopback address: give --tls-cert and --tls-key, or --insecure"},
		{"certificate without key", []string{"--tls-cert=/nonexistent/cert.pem"}, nil, "--tls-cert and --tls-key go together"},
		{"missing certificate files", []string{"--tls-cert=/nonexistent/c.pem", "--tls-key=/nonexistent/k.pem"}, nil, "no such file"},
		{"client CA without certificate", []string{"--tls-client-ca=/etc/hostname"}, nil, "--tls-cert and --tls-key go together"},
		{"netns dir is a file", []string{"--netns-dir=/etc/hostname"}, nil, "is not a directory"},
		{"state dir under a file", []string{"--state-dir=/etc/hostname/state"}, nil, "not a directory"},
		{"netns dir is a symlink", []string{"--netns-dir=/bin"}, nil, "/bin is a symlink"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHost(t)
			args := append(h.args(freePort(t)), tc.args...)
			d := start(t, tc.env, args...)
			if code := d.wait(20 * time.Second); code != 2 {
				t.Fatalf("exit %d, want 2; output:\n%s", code, d.Output())
			}
			out := lines(d.Output())
			if len(out) != 1 || !strings.Contains(out[0], tc.want) {
				t.Fatalf("output %q, want one line containing %q", out, tc.want)
			}
			h.nothingMade(t)
			if tables := run(t, "nft", "list", "tables"); strings.Contains(tables, tableOf(h.prefix)) {
				t.Errorf("nftables table created")
			}
		})
	}
}

// nothingMade fails t if a refused start of a daemon on h made its state
// directory, its netns directory or its lock file.
func (h *host) nothingMade(t *testing.T) {
	t.Helper()
	lock, err := lockfile.SlotsPath(lockfile.DefaultDir, h.netnsDir, h.prefix)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{h.stateDir, h.netnsDir, lock} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s was created", p)
		}
	}
}

func TestSecondFlagSourceFlagsWinOverEnvironment(t *testing.T) {
	h := newHost(t)
	addr := freePort(t)
	// The environment asks for an impossible pool; the flag overrides it.
	d := start(t, []string{"PHASEGATE_POOL_SIZE=100000", "PHASEGATE_LOG_FORMAT=json"}, append(h.args(addr), "--pool-size=2")...)
	d.waitServing(time.Minute)
	if !strings.HasPrefix(strings.TrimSpace(d.Output()), "{") {
		t.Errorf("PHASEGATE_LOG_FORMAT=json not applied: %.200s", d.Output())
	}
	if _, err := os.Stat(filepath.Join(h.stateDir, phases.StateFileName)); err != nil {
		t.Errorf("records in the state dir: %v", err)
	}
}
