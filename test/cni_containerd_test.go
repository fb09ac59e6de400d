package test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// containerd's `ctr run --cni` on a phasegate network: short-lived
// containers, 4 at a time, attach and end with nothing left. Then
// containers run detached, and containerd is killed with -9 along with
// them and its state removed — a runtime that lost its state: their
// attachments are left, with the namespaces gone, until a GC with no
// valid attachment, as a runtime that restarted with nothing sends it,
// ends them all in one call; the slots are made again.
func TestContainerdOnPhasegateNetwork(t *testing.T) {
	h := newHost(t)
	addr := freePort(t)
	d := start(t, nil, h.args(addr, "--slots=64")...)
	d.waitServing(time.Minute)
	n := newCNINetOf(t, "1.0.0", h.prefix+"ctd", d.control, nil)
	hostForwarding(t)
	c := startContainerd(t)

	runShortLivedCtr(t, c, n, h.prefix)
	if l := cniLeases(t, d, n.name); len(l) != 0 {
		t.Errorf("%d attachments left after the short-lived containers", len(l))
	}

	const detached = 3
	for i := range detached {
		id := fmt.Sprintf("%slong%d", h.prefix, i)
		if out, err := c.ctr(n.confDir, "run", "-d", "--cni", "--rootfs", c.rootfs, id, "/bin/sleep", "3600").CombinedOutput(); err != nil {
			t.Fatalf("ctr run -d %s: %v\n%s", id, err, out)
		}
	}
	held := cniLeases(t, d, n.name)
	if len(held) != detached {
		t.Fatalf("%d attachments for %d detached containers", len(held), detached)
	}
	// The runtime loses everything: containerd, its shims and their
	// containers killed, its state removed.
	namespaces := make(map[string]string)
	for id, pid := range c.tasks() {
		namespaces[id], _ = os.Readlink(fmt.Sprintf("/proc/%d/ns/net", pid))
	}
	c.stop()
	for _, dir := range []string{"state", "root"} {
		if err := os.RemoveAll(filepath.Join(c.dir, dir)); err != nil {
			t.Fatal(err)
		}
	}
	if !poll(30*time.Second, func() bool {
		for _, s := range held {
			if len(h.links(s.GetHostInterface())) > 0 {
				return false
			}
		}
		return true
	}) {
		t.Fatalf("30s after the runtime was killed, its containers' namespaces are still there, their attachments' host ends with them; who holds them:\n%s", netnsHolders(namespaces))
	}
	if l := cniLeases(t, d, n.name); len(l) != detached {
		t.Fatalf("%d attachments after the runtime lost its state, want the %d it never ended", len(l), detached)
	}
	// GC is spec 1.1's: containerd 1.6 predates it, a runtime that has it
	// sends it so.
	conf := n.confWith(map[string]any{"cniVersion": "1.1.0", "cni.dev/valid-attachments": []any{}})
	if out, perr := n.exec("GC", conf); perr != nil {
		t.Fatalf("GC: %+v %s", perr, out)
	}
	if l := cniLeases(t, d, n.name); len(l) != 0 {
		t.Errorf("GC left %d of the lost runtime's attachments", len(l))
	}
	if !strings.Contains(d.Output(), fmt.Sprintf(`msg="attachments collected" network=%s released=%d valid=0`, n.name, detached)) {
		t.Error("GC did not log what it collected")
	}
	d.signal(syscall.SIGTERM)
	if code := d.wait(time.Minute); code != 0 {
		t.Fatalf("exit %d", code)
	}
	h.stoppedCleanly(h.prefix, nil)
}

// runShortLivedCtr runs 20 short-lived containers on network n with
// `ctr run --rm --cni`, 4 at a time, each succeeding only if its eth0 has
// an address.
func runShortLivedCtr(t *testing.T, c *containerd, n *cniNet, prefix string) {
	t.Helper()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []string
	ids := make(chan string)
	for range 4 {
		wg.Go(func() {
			for id := range ids {
				var out bytes.Buffer
				// The exit status says whether eth0 has its address: ctr
				// may lose a task's output when the task ends at once.
				cmd := c.ctr(n.confDir, "run", "--rm", "--cni", "--rootfs", c.rootfs, id, "/bin/sh", "-c", "ip -4 -o addr show dev eth0 | grep -q 'inet '")
				cmd.Stdout, cmd.Stderr = &out, &out
				if err := cmd.Run(); err != nil {
					mu.Lock()
					errs = append(errs, fmt.Sprintf("%s: %v: %s", id, err, out.String()))
					mu.Unlock()
				}
			}
		})
	}
	const short = 20
	for i := range short {
		ids <- fmt.Sprintf("%sshort%d", prefix, i)
	}
	close(ids)
	wg.Wait()
	if len(errs) > 0 {
		t.Errorf("%d of %d ctr runs failed, the first: %s", len(errs), short, errs[0])
	}
}

// netnsHolders names, for each container's namespace ("net:[inode]", by
// container id), the processes in it or holding it open: what keeps it
// after its container was killed.
func netnsHolders(namespaces map[string]string) string {
	var b strings.Builder
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for id, ns := range namespaces {
		fmt.Fprintf(&b, "  %s %s:", id, ns)
		for _, proc := range procs {
			if in, _ := os.Readlink(proc + "/ns/net"); in == ns {
				fmt.Fprintf(&b, " %s in it (%s);", filepath.Base(proc), comm(proc))
			}
			fds, _ := filepath.Glob(proc + "/fd/*")
			for _, fd := range fds {
				if to, _ := os.Readlink(fd); to == ns {
					fmt.Fprintf(&b, " %s holds it as fd %s (%s);", filepath.Base(proc), filepath.Base(fd), comm(proc))
				}
			}
		}
		mounts, _ := os.ReadFile("/proc/self/mountinfo")
		for line := range strings.Lines(string(mounts)) {
			if strings.Contains(line, ns) {
				fmt.Fprintf(&b, " mounted: %s;", strings.TrimSpace(line))
			}
		}
		b.WriteString("\n")
	}
	return b.String()
}

// comm is the command name of the process at /proc/PID.
func comm(proc string) string {
	b, _ := os.ReadFile(proc + "/comm")
	return strings.TrimSpace(string(b))
}
