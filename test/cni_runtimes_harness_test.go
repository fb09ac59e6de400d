package test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// busyboxRootfs makes a container's root filesystem from busybox-static:
// the tests' containers run from it, with no registry.
func busyboxRootfs(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "rootfs")
	for _, d := range []string{"bin", "proc", "sys", "dev", "etc", "tmp"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	copyFile(t, "/bin/busybox", filepath.Join(dir, "bin", "busybox"), 0o755)
	for _, a := range []string{"sh", "ip", "nc", "sleep", "cat", "true", "ping", "echo", "grep"} {
		if err := os.Symlink("busybox", filepath.Join(dir, "bin", a)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// refNet writes the conflist of a network of the reference plugins (bridge
// and host-local) on subnet, with its IPAM state in a directory of the
// test's, into dir. The bridge plugin turns on IPv4 forwarding in the
// namespace it runs in: run it in one of the test's (podman.netns).
func refNet(t *testing.T, dir, name, bridge string, subnet netip.Prefix) (ipamDir string) {
	t.Helper()
	ipamDir = filepath.Join(t.TempDir(), "ipam")
	list := map[string]any{"cniVersion": "1.0.0", "name": name, "plugins": []any{map[string]any{
		"type": "bridge", "bridge": bridge, "isGateway": true, "ipMasq": false,
		"ipam": map[string]any{"type": "host-local", "ranges": [][]map[string]string{{{"subnet": subnet.String()}}}, "dataDir": ipamDir},
	}}}
	b, err := json.Marshal(list)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "20-"+name+".conflist"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	return ipamDir
}

// lastSubnet is the last /24 of the host's claimed CIDR, which its daemon
// (with few slots) never reaches: the reference network's.
func lastSubnet(t *testing.T, cidr string) netip.Prefix {
	t.Helper()
	p := netip.MustParsePrefix(cidr)
	a := p.Masked().Addr().As4()
	size := uint32(1) << (32 - p.Bits())
	base := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
	last := base + size - 256
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(last >> 24), byte(last >> 16), byte(last >> 8), 0}), 24)
}

// podman runs podman with state of the test's own (its storage root and
// run root, a containers.conf naming the test's CNI directories), never
// podman's default network.
type podman struct {
	t             *testing.T
	root, runroot string
	conf          string
	rootfs        string
	// netns, when set, is the network namespace podman runs in, and with
	// it the plugins it execs: the reference bridge plugin turns on IPv4
	// forwarding where it runs, which must not be the host.
	netns string
}

func newPodman(t *testing.T, confDir string) *podman {
	t.Helper()
	lookTool(t, "podman", "tools/deps.sh")
	lookTool(t, "runc", "tools/deps.sh")
	// podman refuses a run root longer than 50 bytes: t.TempDir's are.
	base, err := os.MkdirTemp("", "pgpm-")
	if err != nil {
		t.Fatal(err)
	}
	p := &podman{t: t, root: filepath.Join(base, "root"), runroot: filepath.Join(base, "run"), conf: filepath.Join(base, "containers.conf"), rootfs: busyboxRootfs(t)}
	conf := fmt.Sprintf("[network]\nnetwork_backend = \"cni\"\ncni_plugin_dirs = [%q, \"/usr/lib/cni\"]\nnetwork_config_dir = %q\n", cniPath, confDir)
	if err := os.WriteFile(p.conf, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Whatever a failed test left running, and podman's mounts.
		out, _ := p.cmd("ps", "-aq").Output()
		if ids := strings.Fields(string(out)); len(ids) > 0 {
			_ = p.cmd(append([]string{"rm", "-f", "-t", "0"}, ids...)...).Run()
		}
		_ = p.cmd("system", "reset", "-f").Run()
		_ = exec.Command("umount", "-R", "-l", p.runroot).Run()
		_ = exec.Command("umount", "-R", "-l", p.root).Run()
		_ = os.RemoveAll(base)
	})
	return p
}

// cmd is podman with the test's state.
func (p *podman) cmd(args ...string) *exec.Cmd {
	argv := append([]string{"podman", "--root", p.root, "--runroot", p.runroot, "--cgroup-manager", "cgroupfs"}, args...)
	if p.netns != "" {
		argv = append([]string{"nsenter", "--net=" + p.netns, "--"}, argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), "CONTAINERS_CONF="+p.conf)
	return cmd
}

// containers is how many containers podman has, running or not.
func (p *podman) containers() int { return len(p.containerIDs()) }

// containerIDs are the full ids of podman's containers, running or not.
func (p *podman) containerIDs() []string {
	out, err := p.cmd("ps", "-a", "-q", "--no-trunc").Output()
	if err != nil {
		p.t.Fatalf("podman ps: %v", err)
	}
	return strings.Fields(string(out))
}

// gc is the GC podman 4.3 never makes: the plugin exec'd on network n
// with every container podman has (on eth0) as a valid attachment.
func (p *podman) gc(t *testing.T, n *cniNet) {
	t.Helper()
	valid := []map[string]string{}
	for _, id := range p.containerIDs() {
		valid = append(valid, map[string]string{"containerID": id, "ifname": "eth0"})
	}
	conf := n.confWith(map[string]any{"cniVersion": "1.1.0", "cni.dev/valid-attachments": valid})
	if out, perr := n.exec("GC", conf); perr != nil {
		t.Fatalf("GC keeping podman's %d containers: %+v\n%s", len(valid), perr, out)
	}
}

// runArgs are podman run's arguments for a container of the busybox
// rootfs on network (crun refuses this host's hybrid cgroups; the host's
// hard nofile limit is below podman's default).
func (p *podman) runArgs(network string, extra ...string) []string {
	args := []string{"run", "--runtime", "runc", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024", "--network", network}
	return append(append(args, extra...), "--rootfs", p.rootfs)
}

// run runs a container to its end and returns its output.
func (p *podman) run(network string, argv ...string) (string, error) {
	var out bytes.Buffer
	cmd := p.cmd(append(p.runArgs(network, "--rm"), argv...)...)
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// containerd is a containerd the test started, with its own root, state,
// socket and configuration; ctr reaches it and runs its CNI setup in a
// mount namespace of its own where /etc/cni/net.d and /opt/cni/bin are the
// test's (ctr reads only those).
type containerd struct {
	t      *testing.T
	dir    string
	sock   string
	cmd    *exec.Cmd
	binDir string
	rootfs string
}

func startContainerd(t *testing.T) *containerd {
	t.Helper()
	bin := lookTool(t, "containerd", "tools/deps.sh")
	lookTool(t, "ctr", "tools/deps.sh")
	dir := t.TempDir()
	c := &containerd{t: t, dir: dir, sock: filepath.Join(dir, "containerd.sock"), binDir: filepath.Join(dir, "cni-bin"), rootfs: busyboxRootfs(t)}
	conf := fmt.Sprintf(`version = 2
root = %q
state = %q
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.internal.v1.opt", "io.containerd.internal.v1.tracing"]
[grpc]
  address = %q
[ttrpc]
  address = %q
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), c.sock, c.sock+".ttrpc")
	if err := os.WriteFile(filepath.Join(dir, "config.toml"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	// One plugin directory: phasegate's plugin and the reference ones.
	if err := os.MkdirAll(c.binDir, 0o755); err != nil {
		t.Fatal(err)
	}
	copyFile(t, filepath.Join(cniPath, "phasegate-cni"), filepath.Join(c.binDir, "phasegate-cni"), 0o755)
	for _, p := range []string{"bridge", "host-local", "loopback"} {
		if err := os.Symlink(filepath.Join("/usr/lib/cni", p), filepath.Join(c.binDir, p)); err != nil {
			t.Fatal(err)
		}
	}
	c.start(bin)
	t.Cleanup(c.stop)
	return c
}

// start starts containerd and waits for its socket.
func (c *containerd) start(bin string) {
	c.t.Helper()
	var log syncBuffer
	c.cmd = exec.Command(bin, "--config", filepath.Join(c.dir, "config.toml"))
	c.cmd.Stdout, c.cmd.Stderr = &log, &log
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := c.cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	waitFor(c.t, 30*time.Second, "containerd to serve", func() bool {
		return exec.Command("ctr", "--address", c.sock, "version").Run() == nil
	})
}

// stop kills containerd, its shims and their containers. Each container
// is also killed by its host pid: a kill through containerd is lost if
// its shim dies first, and a container whose shim died lives on, holding
// its namespace.
func (c *containerd) stop() {
	tasks := c.tasks()
	for id := range tasks {
		_ = exec.Command("ctr", "--address", c.sock, "task", "kill", "-s", "SIGKILL", id).Run()
	}
	if c.cmd != nil && c.cmd.Process != nil {
		_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
		_ = c.cmd.Wait()
	}
	_ = exec.Command("pkill", "-9", "-f", "containerd-shim.*"+c.dir).Run()
	for _, pid := range tasks {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	_ = exec.Command("umount", "-R", "-l", filepath.Join(c.dir, "state")).Run()
}

// tasks returns the host pid of each task containerd runs, by id (`ctr
// task ls`: a header, then id, pid and status).
func (c *containerd) tasks() map[string]int {
	out, _ := exec.Command("ctr", "--address", c.sock, "task", "ls").Output()
	tasks := make(map[string]int)
	for _, line := range strings.Split(string(out), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		if pid, err := strconv.Atoi(f[1]); err == nil && pid > 0 {
			tasks[f[0]] = pid
		}
	}
	return tasks
}

// ctr runs ctr against this containerd, with confDir as /etc/cni/net.d
// (ctr takes the first network there) and the test's plugin directory as
// /opt/cni/bin, in a private mount namespace.
func (c *containerd) ctr(confDir string, args ...string) *exec.Cmd {
	script := `mount --bind "$1" /etc/cni/net.d && mount -t tmpfs tmpfs /opt && mkdir -p /opt/cni/bin && mount --bind "$2" /opt/cni/bin && shift 2 && exec ctr "$@"`
	argv := append([]string{"--mount", "--propagation", "private", "sh", "-c", script, "ctr", confDir, c.binDir, "--address", c.sock}, args...)
	return exec.Command("unshare", argv...)
}

// hostForwarding reads the host's net.ipv4.ip_forward, and checks at the
// end of the test that it is what it was: no runtime or plugin the test
// ran may change the machine's forwarding.
func hostForwarding(t *testing.T) {
	t.Helper()
	read := func() string {
		b, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	before := read()
	t.Cleanup(func() {
		if after := read(); after != before {
			t.Errorf("the host's net.ipv4.ip_forward went from %s to %s during the test", before, after)
			_ = os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte(before), 0o644)
		}
	})
}
