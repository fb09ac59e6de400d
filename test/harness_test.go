package test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
	"github.com/phasegate/phasegate/network/nft"
	"github.com/phasegate/phasegate/phases/lockfile"
	"github.com/phasegate/phasegate/phasetest/proc"
)

// binary is the phasegate binary built for this test run.
var binary string

func TestMain(m *testing.M) {
	if addr := os.Getenv(workloadEnv); addr != "" {
		os.Exit(runWorkload(addr))
	}
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	if os.Geteuid() != 0 {
		if os.Getenv("PHASEGATE_REQUIRE_TOOLS") == "1" {
			fmt.Fprintln(os.Stderr, "end-to-end tests need root")
			return 1
		}
		fmt.Fprintln(os.Stderr, "skipping end-to-end tests: they need root")
		return 0
	}
	dir, err := os.MkdirTemp("", "phasegate-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	binary = filepath.Join(dir, "phasegate")
	build := exec.Command("go", "build", "-race", "-o", binary, "github.com/phasegate/phasegate/cmd/phasegate")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building phasegate:", err)
		return 1
	}
	if err := installCNIPlugin(dir); err != nil {
		fmt.Fprintln(os.Stderr, "make cni-plugin:", err)
		return 1
	}
	return m.Run()
}

// host is one test's share of the machine: a prefix and directories no other
// test uses, swept clean when the test ends.
type host struct {
	t        *testing.T
	prefix   string
	netnsDir string
	stateDir string
	// cidr is the host's own slot network: a /18 of e2eSpace claimed for
	// the test (claimCIDR), so that slots of tests (and of other test
	// packages) running at the same time never share an address, and a
	// daemon never refuses it for overlapping another's.
	cidr string
	// node, when set, is the namespace the host's daemon runs in: leak puts
	// the leaked slots' host ends there, as a daemon there would have, and
	// links, hasTable, sweep and decommission look and act there.
	node *node
}

func newHost(t *testing.T) *host {
	t.Helper()
	letters := "abcdefghijklmnopqrstuvwxyz"
	p := []byte("e")
	for range 4 {
		p = append(p, letters[rand.IntN(len(letters))])
	}
	base := t.TempDir()
	// Claimed before the sweep is registered, so released after it.
	cidr := claimCIDR(t, string(p)+"-")
	h := &host{
		t:        t,
		prefix:   string(p) + "-",
		netnsDir: filepath.Join(base, "netns"),
		stateDir: filepath.Join(base, "state"),
		cidr:     cidr,
	}
	// Registered after TempDir, so it runs before TempDir's removal.
	t.Cleanup(func() { h.sweep(h.prefix) })
	return h
}

// run runs a command and fails the test on error.
func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		cmdline := strings.Join(args, " ")
		t.Fatalf("%s %.200s: %v\n%.2000s", name, cmdline, err, out)
	}
	return string(out)
}

// sweep removes everything named with prefix: netns files and their mounts
// in the test's directory, host links, the nftables table. It also undoes
// the directory's own bind mount.
func (h *host) sweep(prefix string) {
	entries, _ := os.ReadDir(h.netnsDir)
	for _, e := range entries {
		p := filepath.Join(h.netnsDir, e.Name())
		for syscall.Unmount(p, syscall.MNT_DETACH) == nil {
		}
		if err := os.RemoveAll(p); err != nil {
			h.t.Errorf("sweep: %v", err)
		}
	}
	for syscall.Unmount(h.netnsDir, syscall.MNT_DETACH) == nil {
	}
	for _, l := range h.links(prefix) {
		if out, err := h.command("ip", "link", "del", l).CombinedOutput(); err != nil && len(h.links(l)) > 0 {
			h.t.Errorf("sweep: ip link del %s: %v: %s", l, err, out)
		}
	}
	// Every table is checked and deleted by name: a sweep that cannot run
	// nft fails the test instead of leaving tables behind unnoticed.
	if h.hasTable(prefix) {
		if out, err := h.command("nft", "delete", "table", "inet", nft.TableName(prefix)).CombinedOutput(); err != nil {
			h.t.Errorf("sweep: nft delete table inet %s: %v: %s", nft.TableName(prefix), err, out)
		}
	}
	if lock, err := lockfile.SlotsPath(lockfile.DefaultDir, h.netnsDir, prefix); err == nil {
		if err := os.Remove(lock); err != nil && !os.IsNotExist(err) {
			h.t.Errorf("sweep: %v", err)
		}
	}
}

// command is name with args run where the host's daemon runs: in h.node's
// namespace when it has one, else here.
func (h *host) command(name string, args ...string) *exec.Cmd {
	if h.node != nil {
		return exec.Command("nsenter", append([]string{"--net=" + h.node.ns, "--", name}, args...)...)
	}
	return exec.Command(name, args...)
}

// links lists host links whose name starts with prefix. A listing that
// cannot run fails the test: "no link left" must mean none.
func (h *host) links(prefix string) []string {
	out, err := h.command("ip", "-o", "link", "show").Output()
	if err != nil {
		h.t.Fatalf("ip -o link show: %v", err)
	}
	var names []string
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
		if strings.HasPrefix(name, prefix) {
			names = append(names, name)
		}
	}
	return names
}

// netnsFiles lists the netns directory's entries that start with prefix.
func (h *host) netnsFiles(prefix string) []string {
	entries, _ := os.ReadDir(h.netnsDir)
	var names []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix) {
			names = append(names, e.Name())
		}
	}
	return names
}

// mounts lists the mount points in the netns directory whose name starts
// with prefix.
func (h *host) mounts(prefix string) []string {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	var names []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && filepath.Dir(f[4]) == h.netnsDir && strings.HasPrefix(filepath.Base(f[4]), prefix) {
			names = append(names, filepath.Base(f[4]))
		}
	}
	return names
}

// prepareDir makes the netns directory a shared mount point of its own, as
// iproute2 does, so namespaces can be bound onto files in it.
func (h *host) prepareDir() {
	h.t.Helper()
	if err := os.MkdirAll(h.netnsDir, 0o755); err != nil {
		h.t.Fatal(err)
	}
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	if !strings.Contains(string(mi), " "+h.netnsDir+" ") {
		run(h.t, "mount", "--bind", h.netnsDir, h.netnsDir)
	}
	run(h.t, "mount", "--make-private", h.netnsDir)
	run(h.t, "mount", "--make-shared", h.netnsDir)
}

// leak makes leaked slots the way a killed daemon leaves them: netns files
// <prefix><i> (by unshare) with a veth pair whose host end is <prefix>h<i>
// (by ip), for the free i in [from, from+n), and returns how many.
func (h *host) leak(prefix string, from, n int) int {
	h.t.Helper()
	h.prepareDir()
	// Indices whose name is taken (a slot a daemon made, a leak not yet
	// reclaimed) are skipped: touching a name a namespace is bound at
	// fails, and the fixture must only ever add leaks.
	links := map[string]bool{}
	for _, l := range h.links(prefix + "h") {
		links[l] = true
	}
	var batch bytes.Buffer
	var idx []string
	for i := from; i < from+n; i++ {
		p := filepath.Join(h.netnsDir, fmt.Sprintf("%s%d", prefix, i))
		if _, err := os.Lstat(p); err == nil || links[fmt.Sprintf("%sh%d", prefix, i)] {
			continue
		}
		idx = append(idx, fmt.Sprint(i))
		fmt.Fprintf(&batch, "link add %sh%d type veth peer name eth0 netns %s\n", prefix, i, p)
	}
	if len(idx) == 0 {
		return 0
	}
	run(h.t, "bash", append([]string{"-c", `p="$1"; shift; for i in "$@"; do touch "$p$i" && unshare --net="$p$i" true || exit 1; done`,
		"leak", filepath.Join(h.netnsDir, prefix)}, idx...)...)
	bf := filepath.Join(h.t.TempDir(), "batch")
	if err := os.WriteFile(bf, batch.Bytes(), 0o600); err != nil {
		h.t.Fatal(err)
	}
	if h.node != nil {
		// The host ends go where the daemon runs: the node's namespace.
		run(h.t, "nsenter", "--net="+h.node.ns, "--", "ip", "-batch", bf)
	} else {
		run(h.t, "ip", "-batch", bf)
	}
	return len(idx)
}

// freePort returns a loopback address with a port nobody listens on now.
func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// daemon is a running phasegate process: a phasetest/proc process (its
// output, pid, exit, and its kill and reaping at the test's end) with the
// addresses the test gave it.
type daemon struct {
	*proc.Process
	t    *testing.T
	addr string
	// control is the path of the daemon's control socket, from its
	// --control-socket or --state-dir.
	control string
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startCmd runs cmd, built with exec.Command and the environment and
// descriptors it needs, as a phasetest/proc process: the environment stays
// exactly cmd's (no address file: the test gave the address).
func startCmd(t *testing.T, cmd *exec.Cmd) *proc.Process {
	t.Helper()
	return proc.Start(t, cmd.Path, proc.Args(cmd.Args[1:]...), proc.NoAddrFile(), proc.Prepare(func(c *exec.Cmd) {
		c.Env, c.Dir, c.ExtraFiles, c.SysProcAttr = cmd.Env, cmd.Dir, cmd.ExtraFiles, cmd.SysProcAttr
	}))
}

// args returns the serve flags that confine a daemon to h.
func (h *host) args(addr string, extra ...string) []string {
	return append([]string{
		"serve",
		"--listen=" + addr,
		"--state-dir=" + h.stateDir,
		"--netns-dir=" + h.netnsDir,
		"--slot-prefix=" + h.prefix,
		"--slot-cidr=" + h.cidr,
		"--slots=4000",
		"--pool-size=4",
		"--drain-delay=200ms",
		"--stop-timeout=5s",
		"--log-level=debug",
	}, extra...)
}

// slots returns a client of the daemon's Slots API on its control socket,
// as root (this process).
func (d *daemon) slots() phasegatev1.SlotsClient {
	d.t.Helper()
	if d.control == "" {
		d.t.Fatal("the daemon was started without --state-dir or --control-socket: where is its control socket?")
	}
	return phasegatev1.NewSlotsClient(dial(d.t, "unix://"+d.control))
}

// start execs the binary with args and env and returns at once.
func start(t *testing.T, env []string, args ...string) *daemon {
	t.Helper()
	return startBinary(t, binary, env, args...)
}

// startBinary is start for another build of phasegate.
func startBinary(t *testing.T, bin string, env []string, args ...string) *daemon {
	t.Helper()
	d := &daemon{t: t}
	var stateDir string
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--listen="); ok {
			d.addr = v
		}
		// The last of a repeated flag counts, as in the daemon's flag
		// parsing: a test may give --state-dir again after h.args'.
		if v, ok := strings.CutPrefix(a, "--state-dir="); ok {
			stateDir = v
		}
		if v, ok := strings.CutPrefix(a, "--control-socket="); ok {
			d.control = v
		}
	}
	if d.control == "" && stateDir != "" {
		d.control = filepath.Join(stateDir, "control.sock")
	}
	// The daemon's address is the one given: no address file.
	d.Process = proc.Start(t, bin, proc.Args(args...), proc.Env(env...), proc.NoAddrFile())
	return d
}

// wait waits for the process to end and returns its exit code, -1 when a
// signal ended it.
func (d *daemon) wait(timeout time.Duration) int {
	d.t.Helper()
	return d.WaitState(timeout).ExitCode()
}

// signal sends sig to the process if it still runs.
func (d *daemon) signal(sig syscall.Signal) { d.Signal(sig) }

// get does one HTTP GET against the daemon.
func (d *daemon) get(path string) (int, string, error) {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + d.addr + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), nil
}

// waitFor polls cond until it holds or the timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if !poll(timeout, cond) {
		t.Fatalf("timed out after %v waiting for %s", timeout, what)
	}
}

// poll polls cond until it holds (true) or the timeout passes (false).
func poll(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// waitServing waits until /readyz answers 200.
func (d *daemon) waitServing(timeout time.Duration) {
	d.t.Helper()
	waitFor(d.t, timeout, "the daemon to serve", func() bool {
		code, _, err := d.get("/readyz")
		return err == nil && code == http.StatusOK
	})
}

// lookTool finds an installed tool, in PATH or in GOPATH/bin.
func lookTool(t *testing.T, name, install string) string {
	t.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	if out, err := exec.Command("go", "env", "GOPATH").Output(); err == nil {
		p := filepath.Join(strings.TrimSpace(string(out)), "bin", name)
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if os.Getenv("PHASEGATE_REQUIRE_TOOLS") == "1" {
		t.Fatalf("%s not found; install it with: %s", name, install)
	}
	t.Skipf("%s not found; install it with: %s", name, install)
	return ""
}

// lines returns the non-empty lines of s.
func lines(s string) []string {
	var out []string
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" {
			out = append(out, l)
		}
	}
	return out
}

// waitReclaimed waits until the daemon serves and its background reclaim
// of dead slots and verification of restored leases, if it had any, have
// ended: what a test that counts what is
// left on the host must wait for, now that serving no longer waits for it.
func (d *daemon) waitReclaimed(timeout time.Duration) {
	d.t.Helper()
	d.waitServing(timeout)
	waitFor(d.t, timeout, "the background reclaim to end", func() bool {
		_, body, err := d.get("/debug/lifecycle")
		if err != nil {
			return false
		}
		var v struct {
			Tasks []struct{ Name, State string }
		}
		if json.Unmarshal([]byte(body), &v) != nil {
			return false
		}
		for _, t := range v.Tasks {
			if (t.Name == "reclaim-dead" || t.Name == "verify-leases") && t.State == "running" {
				return false
			}
		}
		// The task is there from the moment populate ends, if there is
		// one; the restore line says whether there is anything to do.
		return strings.Contains(d.Output(), "msg=\"restore:")
	})
}
