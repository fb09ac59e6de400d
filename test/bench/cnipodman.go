package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"time"
)

// benchPodman is podman with state of the benchmark's own, on a directory
// of two networks: phasegate's and the reference one.
type benchPodman struct {
	base, conf, netDir, rootfs string
}

// newBenchPodman writes both networks' conflists (spec 1.0.0, which
// Debian's podman speaks) for the daemon on socket, and podman's
// configuration.
func (b *cniBench) newBenchPodman(socket string) (*benchPodman, error) {
	// podman refuses a run root longer than 50 bytes.
	base, err := os.MkdirTemp("", "pgb-")
	if err != nil {
		return nil, err
	}
	p := &benchPodman{base: base, conf: filepath.Join(base, "containers.conf"), netDir: filepath.Join(base, "net.d"), rootfs: filepath.Join(base, "rootfs")}
	if err := p.writeRootfs(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(p.netDir, 0o755); err != nil {
		return nil, err
	}
	for _, plugin := range []string{pluginPhasegate, pluginReference} {
		var c map[string]any
		if err := json.Unmarshal(b.conf(plugin, socket), &c); err != nil {
			return nil, err
		}
		name := c["name"].(string)
		delete(c, "name")
		delete(c, "cniVersion")
		list, _ := json.Marshal(map[string]any{"cniVersion": "1.0.0", "name": name, "plugins": []any{c}})
		if err := os.WriteFile(filepath.Join(p.netDir, name+".conflist"), list, 0o644); err != nil {
			return nil, err
		}
	}
	conf := fmt.Sprintf("[network]\nnetwork_backend = \"cni\"\ncni_plugin_dirs = [%q, %q]\nnetwork_config_dir = %q\n", filepath.Dir(b.plugin), refPluginDir, p.netDir)
	return p, os.WriteFile(p.conf, []byte(conf), 0o644)
}

// writeRootfs makes a busybox root filesystem.
func (p *benchPodman) writeRootfs() error {
	bin := filepath.Join(p.rootfs, "bin")
	for _, d := range []string{"bin", "proc", "sys", "dev", "etc"} {
		if err := os.MkdirAll(filepath.Join(p.rootfs, d), 0o755); err != nil {
			return err
		}
	}
	if out, err := exec.Command("cp", "/bin/busybox", bin).CombinedOutput(); err != nil {
		return fmt.Errorf("cp busybox: %w: %s", err, out)
	}
	return os.Symlink("busybox", filepath.Join(bin, "ip"))
}

// run runs one container on network, podman in the namespace at node,
// until its eth0 has its address, and returns how long `podman run` took.
func (p *benchPodman) run(ctx context.Context, node, network string) (time.Duration, error) {
	cmd := exec.CommandContext(ctx, "podman", "--root", filepath.Join(p.base, "root"), "--runroot", filepath.Join(p.base, "run"),
		"--cgroup-manager", "cgroupfs", "run", "--rm", "--runtime", "runc", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024",
		"--network", network, "--rootfs", p.rootfs, "/bin/ip", "-4", "-o", "addr", "show", "dev", "eth0")
	cmd.Env = append(os.Environ(), "CONTAINERS_CONF="+p.conf)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	took, err := runIn(node, cmd)
	if err != nil || !bytes.Contains(out.Bytes(), []byte("inet ")) {
		return took, fmt.Errorf("podman run on %s: %v: %s", network, err, out.String())
	}
	return took, nil
}

// close removes podman's state.
func (p *benchPodman) close() {
	cmd := exec.Command("podman", "--root", filepath.Join(p.base, "root"), "--runroot", filepath.Join(p.base, "run"), "system", "reset", "-f")
	cmd.Env = append(os.Environ(), "CONTAINERS_CONF="+p.conf)
	_ = cmd.Run()
	_ = exec.Command("umount", "-R", "-l", filepath.Join(p.base, "run")).Run()
	_ = exec.Command("umount", "-R", "-l", filepath.Join(p.base, "root")).Run()
	_ = os.RemoveAll(p.base)
}

// podmanRep runs -cni-podman containers on each network, one at a time,
// the networks alternating (a warm-up run of each first, not counted).
func (b *cniBench) podmanRep(ctx context.Context, rep int, res *CNIResult) error {
	if b.r.o.cniPodman == 0 {
		return nil
	}
	if _, err := exec.LookPath("podman"); err != nil {
		return fmt.Errorf("podman not installed (tools/deps.sh installs it), or run with -cni-podman 0: %w", err)
	}
	d, err := b.startDaemon(ctx, 4)
	if err != nil {
		return err
	}
	defer d.kill()
	p, err := b.newBenchPodman(d.control)
	if err != nil {
		return err
	}
	defer p.close()
	nets := map[string]string{pluginPhasegate: b.r.h.cfg.Prefix + "cni", pluginReference: b.r.h.cfg.Prefix + "ref"}
	order := []string{pluginPhasegate, pluginReference}
	if rep%2 == 1 {
		slices.Reverse(order)
	}
	for _, plugin := range order {
		if _, err := p.run(ctx, b.node, nets[plugin]); err != nil {
			return err
		}
	}
	for range b.r.o.cniPodman {
		for _, plugin := range order {
			took, err := p.run(ctx, b.node, nets[plugin])
			if err != nil {
				return err
			}
			res.Podman[plugin] = append(res.Podman[plugin], ms(took))
		}
	}
	b.r.logf("cni rep %d podman run: phasegate p50 %s, reference p50 %s", rep+1,
		fmtMs(percentileOf(res.Podman[pluginPhasegate], 0.5)), fmtMs(percentileOf(res.Podman[pluginReference], 0.5)))
	if _, err := d.stop(); err != nil {
		return err
	}
	return b.r.reset(ctx)
}

// percentileOf is the p-quantile of unsorted xs.
func percentileOf(xs []float64, p float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return percentile(s, p)
}
