package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/containernetworking/cni/libcni"
	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/network/netns"
)

// prefix names every object of the command: the slots, their namespaces.
const prefix = "pgcc-"

// conflist is one way of asking for ports and a limit.
type conflist struct {
	name, network string
	// plugins are the list's plugins after phasegate-cni's own entry,
	// which the list opens with.
	plugins []map[string]any
	// own: phasegate-cni takes the capabilities itself; neither own nor
	// plugins: nobody takes them, and libcni passes none.
	own bool
}

// sides are the conflists: phasegate's own first, the chain second, and
// phasegate-cni with neither capability, what ports and a limit cost
// beside it.
var sides = []conflist{
	{name: "phasegate-cni (ports and bandwidth itself)", network: "cc-own", own: true},
	{name: "phasegate-cni + portmap + bandwidth", network: "cc-chain", plugins: []map[string]any{
		{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}, "snat": true},
		{"type": "bandwidth", "capabilities": map[string]bool{"bandwidth": true}},
	}},
	{name: "phasegate-cni, no ports nor limit", network: "cc-plain"},
}

// node is the namespace playing the node, the containers' namespaces and
// the built binaries.
type node struct {
	dir, nsDir string
	path       string   // the node's namespace
	ctrs       []string // the containers' namespaces
	daemonBin  string
}

// newNode builds phasegate and phasegate-cni and makes the namespaces.
func newNode(ctx context.Context, dir string, containers int) (*node, error) {
	n := &node{dir: dir, nsDir: filepath.Join(dir, "ns"), daemonBin: filepath.Join(binDir(dir), "phasegate")}
	for _, cmd := range []string{"phasegate", "phasegate-cni"} {
		out, err := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(binDir(dir), cmd), "github.com/phasegate/phasegate/cmd/"+cmd).CombinedOutput()
		if err != nil {
			return nil, fmt.Errorf("build %s: %w: %s", cmd, err, out)
		}
	}
	var err error
	if n.path, err = netns.Create(ctx, n.nsDir, "node"); err != nil {
		return nil, err
	}
	if out, err := n.inNode(ctx, "ip", "link", "set", "lo", "up").CombinedOutput(); err != nil {
		n.close()
		return nil, fmt.Errorf("the node's lo up: %w: %s", err, out)
	}
	for i := range containers {
		p, err := netns.Create(ctx, n.nsDir, "c"+strconv.Itoa(i))
		if err != nil {
			n.close()
			return nil, err
		}
		n.ctrs = append(n.ctrs, p)
	}
	return n, nil
}

// daemonFlags are the daemon's, for serve and decommission alike: all of
// its state under dir, its slots under prefix.
func (n *node) daemonFlags() []string {
	return []string{"--state-dir=" + filepath.Join(n.dir, "state"), "--netns-dir=" + filepath.Join(n.dir, "slots"),
		"--lock-dir=" + filepath.Join(n.dir, "locks"), "--slot-prefix=" + prefix, "--slot-cidr=169.254.128.0/24"}
}

// inNode is cmd run in the node's namespace.
func (n *node) inNode(ctx context.Context, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + n.path}, args...)...)
}

// close decommissions the slots and deletes the namespaces; the node's
// takes whatever a reference plugin left in it.
func (n *node) close() {
	ctx := context.Background()
	args := append([]string{n.daemonBin, "decommission", "--destroy-leased-slots"}, n.daemonFlags()...)
	if out, err := n.inNode(ctx, args...).CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "decommission: %v: %s\n", err, out)
	}
	for i := range n.ctrs {
		_ = netns.Delete(ctx, n.nsDir, "c"+strconv.Itoa(i))
	}
	_ = netns.Delete(ctx, n.nsDir, "node")
	// Both directories of namespace files are bind mounts of themselves
	// (as `ip netns` makes /run/netns), the slots' made by the daemon.
	for _, d := range []string{n.nsDir, filepath.Join(n.dir, "slots")} {
		for unix.Unmount(d, unix.MNT_DETACH) == nil {
		}
	}
}

// rep starts a daemon whose warm pool holds every ADD of every side,
// attaches and detaches the containers with each side in turn, and stops
// the daemon.
func (n *node) rep(ctx context.Context, rep int, o options, got map[string]*side) error {
	stop, socket, err := n.startDaemon(ctx, rep, len(sides)*o.containers)
	if err != nil {
		return err
	}
	defer stop()
	cn := libcni.NewCNIConfigWithCacheDir([]string{binDir(n.dir), o.refDir}, filepath.Join(n.dir, "cache"), nil)
	k := rep % len(sides) // the order turns from rep to rep
	order := append(slices.Clone(sides[k:]), sides[:k]...)
	fd, err := netns.Open(n.path)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	// The plugins libcni execs from this thread run in the node's
	// namespace, as a runtime's do in its host's.
	return netns.Do(fd, func() error {
		for si, s := range order {
			list, err := s.list(socket)
			if err != nil {
				return err
			}
			g := got[s.name]
			for i, ctr := range n.ctrs {
				rt := runtimeConf(fmt.Sprintf("r%ds%dc%d", rep, si, i), ctr, 20000+1000*si+i)
				t0 := time.Now()
				if _, err := cn.AddNetworkList(ctx, list, rt); err != nil {
					return fmt.Errorf("%s: ADD of container %d: %w", s.name, i, err)
				}
				g.add = append(g.add, time.Since(t0))
			}
			for i, ctr := range n.ctrs {
				rt := runtimeConf(fmt.Sprintf("r%ds%dc%d", rep, si, i), ctr, 20000+1000*si+i)
				t0 := time.Now()
				if err := cn.DelNetworkList(ctx, list, rt); err != nil {
					return fmt.Errorf("%s: DEL of container %d: %w", s.name, i, err)
				}
				g.del = append(g.del, time.Since(t0))
			}
		}
		return nil
	})
}

// list is the side's conflist for the daemon at socket: spec 1.0.0, the
// newest Debian's reference plugins speak.
func (s conflist) list(socket string) (*libcni.NetworkConfigList, error) {
	own := map[string]any{"type": "phasegate-cni", "socket": socket, "timeout": "60s"}
	if s.own {
		own["capabilities"] = map[string]bool{"portMappings": true, "bandwidth": true}
	}
	b, err := json.Marshal(map[string]any{"cniVersion": "1.0.0", "name": s.network,
		"plugins": append([]map[string]any{own}, s.plugins...)})
	if err != nil {
		return nil, err
	}
	return libcni.ConfListFromBytes(b)
}

// runtimeConf is a container's: one published port, 100 Mbit/s each way.
func runtimeConf(id, ctr string, hostPort int) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{ContainerID: id, NetNS: ctr, IfName: "eth0", CapabilityArgs: map[string]any{
		"portMappings": []map[string]any{{"hostPort": hostPort, "containerPort": 8080, "protocol": "tcp"}},
		"bandwidth":    map[string]any{"ingressRate": 100_000_000, "ingressBurst": 2_000_000, "egressRate": 100_000_000, "egressBurst": 2_000_000},
	}}
}

// startDaemon starts phasegate in the node's namespace with a warm pool
// of pool slots and waits until the pool is full. It returns the daemon's
// stop and its control socket.
func (n *node) startDaemon(ctx context.Context, rep, pool int) (func(), string, error) {
	logPath := filepath.Join(n.dir, "daemon-"+strconv.Itoa(rep)+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, "", err
	}
	args := append([]string{n.daemonBin, "serve", "--listen=127.0.0.1:5008", "--pool-size=" + strconv.Itoa(pool),
		"--control-rate=0", "--log-format=json"}, n.daemonFlags()...)
	cmd := n.inNode(context.WithoutCancel(ctx), args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, "", err
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	stop := func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		<-exited
		logf.Close()
	}
	if err := waitFilled(ctx, logPath, exited, time.Minute); err != nil {
		stop()
		return nil, "", err
	}
	return stop, filepath.Join(n.dir, "state", "control.sock"), nil
}

// waitFilled waits for the daemon's log to say that its pool's fill
// ended, or for the daemon to exit.
func waitFilled(ctx context.Context, logPath string, exited <-chan struct{}, within time.Duration) error {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		b, err := os.ReadFile(logPath)
		if err != nil {
			return err
		}
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			var l struct{ Msg, Task, State string }
			if json.Unmarshal(sc.Bytes(), &l) == nil && l.Task == "fill" && l.Msg == "background task ended" {
				if l.State != "succeeded" {
					return fmt.Errorf("the pool's fill %s: %s", l.State, logPath)
				}
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-exited:
			b, _ := os.ReadFile(logPath)
			return fmt.Errorf("the daemon exited: %s", strings.TrimSpace(string(b)))
		case <-time.After(50 * time.Millisecond):
		}
	}
	b, _ := os.ReadFile(logPath)
	return fmt.Errorf("the pool did not fill within %s: %s", within, strings.TrimSpace(string(b)))
}
