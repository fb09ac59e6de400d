package test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/phasegate/phasegate/internal/testcerts"
	"github.com/phasegate/phasegate/test/internal/microvm"
)

// node stands in for the machine a deployment file runs on: a network
// namespace the test makes, with one interface whose private address plays
// the node's IP (what Nomad puts in NOMAD_IP_api and Kubernetes in
// status.podIP). The daemon runs inside it and every probe connects from
// inside it, so no packet leaves the namespace, none of this machine's own
// interfaces is used, and the file's own port is free whatever else runs
// here. The daemon's slots (host-side veths, its nftables table) land in the
// namespace too and go with it.
type node struct {
	t  *testing.T
	ns string     // the namespace's bind-mounted file
	ip netip.Addr // the node's address
}

func newNode(t *testing.T) *node {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "node")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	run(t, "mount", "--bind", dir, dir)
	run(t, "mount", "--make-private", dir)
	n := &node{
		t:  t,
		ns: filepath.Join(dir, "net"),
		ip: netip.AddrFrom4([4]byte{10, byte(rand.IntN(256)), byte(rand.IntN(256)), byte(2 + rand.IntN(250))}),
	}
	// Registered after TempDir and before any daemon starts, so it runs
	// after the daemons are killed and before TempDir's removal. Once the
	// file is unmounted and the daemon gone, the kernel destroys the
	// namespace and everything in it.
	t.Cleanup(func() {
		_ = syscall.Unmount(n.ns, syscall.MNT_DETACH)
		_ = syscall.Unmount(dir, syscall.MNT_DETACH)
	})
	if err := os.WriteFile(n.ns, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	run(t, "unshare", "--net="+n.ns, "true")
	// A veth pair with both ends inside: this kernel has no dummy module.
	for _, cmd := range [][]string{
		{"ip", "link", "set", "lo", "up"},
		{"ip", "link", "add", "node0", "type", "veth", "peer", "name", "node1"},
		{"ip", "addr", "add", n.ip.String() + "/24", "dev", "node0"},
		{"ip", "link", "set", "node0", "up"},
		{"ip", "link", "set", "node1", "up"},
	} {
		run(t, "nsenter", append([]string{"--net=" + n.ns, "--"}, cmd...)...)
	}
	return n
}

// inNamespace runs f on a thread that entered the node's namespace and
// never returns to the Go scheduler (microvm.InNamespace). Sockets f makes
// belong to the namespace for their whole life, whichever thread uses
// them later.
func (n *node) inNamespace(f func() error) error {
	return microvm.InNamespace(n.ns, f)
}

// dial connects from inside the node's namespace.
func (n *node) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := n.inNamespace(func() error {
		var d net.Dialer
		var err error
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// listen makes a listening TCP socket inside the node's namespace with the
// given backlog, the way systemd makes a socket unit's (Backlog=).
func (n *node) listen(addr string, backlog int) *os.File {
	n.t.Helper()
	ap, err := netip.ParseAddrPort(addr)
	if err != nil || !ap.Addr().Is4() {
		n.t.Fatalf("listen address %q: want IPv4 address:port (%v)", addr, err)
	}
	var f *os.File
	err = n.inNamespace(func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("socket: %w", err)
		}
		f = os.NewFile(uintptr(fd), "listen")
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
			return fmt.Errorf("SO_REUSEADDR: %w", err)
		}
		if err := unix.Bind(fd, &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}); err != nil {
			return fmt.Errorf("bind %s: %w", addr, err)
		}
		if err := unix.Listen(fd, backlog); err != nil {
			return fmt.Errorf("listen %s: %w", addr, err)
		}
		return nil
	})
	if err != nil {
		if f != nil {
			f.Close()
		}
		n.t.Fatal(err)
	}
	n.t.Cleanup(func() { f.Close() })
	return f
}

// command returns a command that runs argv inside the node's namespace
// with exactly env as its environment (nsenter execs argv: the pid is
// argv's).
func (n *node) command(env []string, argv ...string) *exec.Cmd {
	cmd := exec.Command("nsenter", append([]string{"--net=" + n.ns, "--"}, argv...)...)
	cmd.Env = env
	return cmd
}

// start runs argv inside the node as a daemon whose port is addr, and
// returns at once; the test's clean-up kills it.
func (n *node) start(addr string, cmd *exec.Cmd) *daemon {
	t := n.t
	t.Helper()
	return &daemon{Process: startCmd(t, cmd), t: t, addr: addr}
}

// running reports whether the daemon's process has not exited.
func (d *daemon) running() bool { return d.Running() }

// exe is the program the daemon's process runs now.
func (d *daemon) exe() string {
	p, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", d.Pid()))
	return p
}

// httpGet does one GET the way an HTTP checker does: a fresh connection
// from inside the node, no keep-alive, the checker's timeout; tlsCfg is
// used for https URLs. It returns the status code.
func (n *node) httpGet(url string, tlsCfg *tls.Config, timeout time.Duration) (int, error) {
	tr := &http.Transport{
		DialContext:       n.dial,
		TLSClientConfig:   tlsCfg,
		DisableKeepAlives: true,
	}
	defer tr.CloseIdleConnections()
	c := http.Client{Transport: tr, Timeout: timeout}
	resp, err := c.Get(url)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	return resp.StatusCode, nil
}

// grpcHealth asks grpc.health.v1 Check(service) on addr from inside the
// node, with creds (TLS or plaintext), the way a gRPC checker does: a new
// connection per check.
func (n *node) grpcHealth(addr, service string, creds credentials.TransportCredentials, timeout time.Duration) (healthpb.HealthCheckResponse_ServingStatus, error) {
	conn, err := grpc.NewClient("passthrough:///"+addr,
		grpc.WithTransportCredentials(creds),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) { return n.dial(ctx, "tcp", a) }))
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		return 0, err
	}
	return resp.GetStatus(), nil
}

// peerCertificate returns the certificate the daemon at addr presents.
func (n *node) peerCertificate(addr string) (*x509.Certificate, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	raw, err := n.dial(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	c := tls.Client(raw, &tls.Config{InsecureSkipVerify: true})
	defer c.Close()
	if err := c.HandshakeContext(ctx); err != nil {
		return nil, err
	}
	return c.ConnectionState().PeerCertificates[0], nil
}

// verifiedProbe runs `phasegate probe` inside the node against addr,
// verifying the daemon's certificate against the CA the test issued it
// from: the deployment's TLS material is what the daemon serves, and a
// client that checks identity gets SERVING. testcerts' server certificate
// names localhost, hence the server name.
func (n *node) verifiedProbe(addr string, certs *testcerts.Set) (string, error) {
	out, err := n.command(baseEnv(), binary, "probe", "--addr="+addr, "--tls-ca="+certs.CAFile, "--tls-server-name=localhost").CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// newCerts makes a CA and a server certificate, written to a directory of
// their own.
func newCerts(t *testing.T) *testcerts.Set {
	t.Helper()
	certs, err := testcerts.New()
	if err != nil {
		t.Fatal(err)
	}
	if err := certs.WriteFiles(t.TempDir()); err != nil {
		t.Fatal(err)
	}
	return certs
}

// pemFile reads a PEM file testcerts wrote.
func pemFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// writeFile writes data to path, making its directory.
func writeFile(t *testing.T, path string, data []byte, perm os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, perm); err != nil {
		t.Fatal(err)
	}
}

func contextTimeout(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), d)
}

// resolved is what `phasegate serve <args> --check` prints.
type resolved struct {
	Listen            string  `json:"listen"`
	TLS               bool    `json:"tls"`
	StateDir          string  `json:"state_dir"`
	Lock              string  `json:"lock"`
	NetnsDir          string  `json:"netns_dir"`
	StartTimeout      string  `json:"start_timeout"`
	DrainDelay        string  `json:"drain_delay"`
	StopTimeout       string  `json:"stop_timeout"`
	StopBudgetSeconds float64 `json:"stop_budget_seconds"`
	OpenFiles         uint64  `json:"open_files"`
	PortConns         int     `json:"port_conns"`
	MaxLeases         int     `json:"max_leases"`
}

// stopBudget is the daemon's worst-case orderly stop.
func (r resolved) stopBudget() time.Duration {
	return time.Duration(r.StopBudgetSeconds * float64(time.Second))
}

// startBudget is how long the daemon lets its start take: its own start
// timeout, plus the stop budget for the rollback after it.
func (r resolved) startBudget(t *testing.T) time.Duration {
	t.Helper()
	d, err := time.ParseDuration(r.StartTimeout)
	if err != nil || d == 0 {
		t.Fatalf("start_timeout %q: the deployment must bound the start (%v)", r.StartTimeout, err)
	}
	return d + r.stopBudget()
}

// check runs `serve <args> --check` inside the node with env, the daemon's
// own verdict on a deployment's command line, and returns what it
// resolved. args are the file's, before the test confines them: the paths
// it prints are production's.
func (n *node) check(env []string, args []string) resolved {
	n.t.Helper()
	return n.checkUnder(env, nil, args)
}

// checkUnder is check with the binary run by wrap (prlimit with its
// options, as a supervisor sets the limits it is given).
func (n *node) checkUnder(env, wrap, args []string) resolved {
	n.t.Helper()
	var out, errb strings.Builder
	cmd := n.command(env, append(append(append(wrap, binary), args...), "--check")...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		n.t.Fatalf("phasegate %s --check: %v\n%s%s", strings.Join(args, " "), err, out.String(), errb.String())
	}
	var r resolved
	if err := json.Unmarshal([]byte(out.String()), &r); err != nil {
		n.t.Fatalf("--check printed %q: %v", out.String(), err)
	}
	if r.StopBudgetSeconds <= 0 {
		n.t.Fatalf("--check: stop budget %v: the deployment's stop is unbounded (--stop-timeout 0), so no supervisor timeout can cover it", r.StopBudgetSeconds)
	}
	// A shipped file says each principal's quota of leases, so that an
	// operator sees it (docs/SECURITY.md, "The policy").
	if !slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--max-leases=") }) || r.MaxLeases <= 0 {
		n.t.Errorf("the deployment does not set --max-leases (max_leases %d): one tenant could lease every slot", r.MaxLeases)
	}
	return r
}

// confine returns the only flags a test adds to a deployment's command
// line, after the file's own (the last of a repeated flag wins): the
// test's own netns directory, slot prefix, state directory and slot
// network. The files keep what production needs (/run/netns, pg-,
// /run/phasegate, 169.254.128.0/19); a test must not touch the host's slots
// nor collide with another test's. Everything else — listen address, TLS,
// drain and stop timeouts, start timeout, the port the checks probe — is
// exactly the file's.
func confine(h *host) []string {
	return []string{
		"--netns-dir=" + h.netnsDir,
		"--slot-prefix=" + h.prefix,
		"--state-dir=" + h.stateDir,
		"--slot-cidr=" + h.cidr,
	}
}

// baseEnv is the environment a supervisor gives a service before its own
// variables: PATH only. The test's own environment (and any PHASEGATE_*
// variable in it) stays out, as it would on a node.
func baseEnv() []string {
	return []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
}

// waitExit waits for the daemon to exit within a supervisor's stop timeout
// (after which the supervisor would SIGKILL it) and fails unless it exited
// 0, an orderly stop.
func (d *daemon) waitExit(timeout time.Duration, supervisor string) {
	d.t.Helper()
	select {
	case <-d.Done():
	case <-time.After(timeout):
		d.t.Fatalf("the daemon did not stop within %s (%v): the supervisor would have killed it\n%s", supervisor, timeout, d.Output())
	}
	if d.Err() != nil {
		d.t.Fatalf("the daemon's stop was not orderly: %v\n%s", d.Err(), d.Output())
	}
}

// notifySocket plays systemd's side of sd_notify: a datagram socket whose
// path goes in NOTIFY_SOCKET. Every message the daemon sends is kept, with
// the time it arrived.
type notifySocket struct {
	path string
	conn *net.UnixConn

	mu   sync.Mutex
	msgs []notifyMsg
}

type notifyMsg struct {
	at     time.Time
	fields map[string]string
}

func newNotifySocket(t *testing.T) *notifySocket {
	t.Helper()
	s := &notifySocket{path: filepath.Join(t.TempDir(), "notify")}
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: s.path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	s.conn = conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 64<<10)
		for {
			k, err := conn.Read(buf)
			if err != nil {
				return
			}
			m := notifyMsg{at: time.Now(), fields: map[string]string{}}
			sc := bufio.NewScanner(strings.NewReader(string(buf[:k])))
			for sc.Scan() {
				if key, v, ok := strings.Cut(sc.Text(), "="); ok {
					m.fields[key] = v
				}
			}
			s.mu.Lock()
			s.msgs = append(s.msgs, m)
			s.mu.Unlock()
		}
	}()
	t.Cleanup(func() { conn.Close(); <-done })
	return s
}

// next waits for the first message at index from or later that has key,
// and returns its index.
func (s *notifySocket) next(t *testing.T, from int, key string, timeout time.Duration) (int, notifyMsg) {
	t.Helper()
	var idx int
	var msg notifyMsg
	waitFor(t, timeout, "sd_notify "+key, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		for i := from; i < len(s.msgs); i++ {
			if _, ok := s.msgs[i].fields[key]; ok {
				idx, msg = i, s.msgs[i]
				return true
			}
		}
		return false
	})
	return idx, msg
}

// all returns the messages from index from on that have key.
func (s *notifySocket) all(from int, key string) []notifyMsg {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []notifyMsg
	for i := from; i < len(s.msgs); i++ {
		if _, ok := s.msgs[i].fields[key]; ok {
			out = append(out, s.msgs[i])
		}
	}
	return out
}

// count is the number of messages so far.
func (s *notifySocket) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.msgs)
}

// usec parses an sd_notify microseconds value.
func usec(t *testing.T, v string) time.Duration {
	t.Helper()
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		t.Fatalf("microseconds %q: %v", v, err)
	}
	return time.Duration(n) * time.Microsecond
}
