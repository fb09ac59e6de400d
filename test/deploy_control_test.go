package test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
	"github.com/phasegate/phasegate/internal/testcerts"
)

// assertControlGuarded shows that a daemon started from a deploy file, as
// shipped, serves the Slots API only on its control surface: a client of
// the port without a client certificate is refused (Unauthenticated), an
// unprivileged user outside the socket's group cannot connect to the
// socket, and the node's orchestrator (root on the socket) leases and
// releases. certs is the port's TLS material (nil for plain text).
func assertControlGuarded(t *testing.T, n *node, d *daemon, h *host, certs *testcerts.Set) {
	t.Helper()
	pub := newPublicDir(t)
	port := []string{"--addr=" + d.addr}
	if certs != nil {
		ca := filepath.Join(pub.dir, "ca.pem")
		copyFile(t, certs.CAFile, ca, 0o644)
		port = append(port, "--tls-ca="+ca, "--tls-server-name=localhost")
	}
	attack := func(args ...string) (string, int) {
		t.Helper()
		cmd := n.command(baseEnv(), append([]string{"runuser", "-u", "nobody", "--", pub.binary}, args...)...)
		cmd.Dir = pub.dir
		out, err := cmd.CombinedOutput()
		return string(out), exitCode(err)
	}
	out, code := attack(append([]string{"slots", "acquire", "intruder"}, port...)...)
	wantRefused(t, "Acquire on the port without a client certificate", out, code, "Unauthenticated")
	out, code = attack(append([]string{"slots", "list"}, port...)...)
	wantRefused(t, "List on the port without a client certificate", out, code, "Unauthenticated")

	d.control = filepath.Join(h.stateDir, "control.sock")
	out, code = attack("slots", "list", "--socket="+d.control)
	if code != 1 || !strings.Contains(out, "permission denied") {
		t.Errorf("nobody on the control socket: exit %d %q, want permission denied", code, out)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := d.slots()
	resp, err := c.Acquire(ctx, &phasegatev1.AcquireRequest{Owner: "sandbox-1", RequestId: "deploy-test"})
	if err != nil {
		t.Fatalf("the orchestrator (root) on the control socket: Acquire: %v", err)
	}
	if _, err := c.Release(ctx, &phasegatev1.ReleaseRequest{Index: resp.GetSlot().GetIndex(), LeaseId: resp.GetLeaseId()}); err != nil {
		t.Fatalf("the orchestrator (root) on the control socket: Release: %v", err)
	}
	if fi, err := os.Lstat(d.control); err != nil || fi.Mode().Perm() != 0o660 {
		t.Errorf("control socket %v %v, want mode 0660", fi, err)
	}
}

// sysusersFile is the shipped sysusers.d file of the systemd units.
const sysusersFile = "../deploy/systemd/phasegate-sysusers.conf"

// installSysusers creates the groups the shipped sysusers.d file declares,
// with systemd-sysusers as a package install does, and removes at the end
// of the test those it created.
func installSysusers(t *testing.T) {
	t.Helper()
	sysusers := lookTool(t, "systemd-sysusers", "apt-get install systemd")
	b, err := os.ReadFile(sysusersFile)
	if err != nil {
		t.Fatal(err)
	}
	var created []string
	for _, ln := range strings.Split(string(b), "\n") {
		f := strings.Fields(ln)
		if len(f) < 2 || f[0] != "g" {
			continue
		}
		if exec.Command("getent", "group", f[1]).Run() != nil {
			created = append(created, f[1])
		}
	}
	if len(created) == 0 {
		return // there already: this host's, not ours to remove
	}
	t.Cleanup(func() {
		for _, g := range created {
			if out, err := exec.Command("groupdel", g).CombinedOutput(); err != nil {
				t.Errorf("groupdel %s: %v %s", g, err, out)
			}
		}
	})
	abs, err := filepath.Abs(sysusersFile) // a relative name is looked up in sysusers.d
	if err != nil {
		t.Fatal(err)
	}
	run(t, sysusers, abs)
	for _, g := range created {
		if exec.Command("getent", "group", g).Run() != nil {
			t.Fatalf("systemd-sysusers %s did not create group %s", sysusersFile, g)
		}
	}
}

// reachable lets every user traverse (not list) the directories above dir
// up to /tmp, as /run is on a host: the test's own directories are 0700.
func reachable(t *testing.T, dir string) {
	t.Helper()
	for d := filepath.Dir(dir); d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
}
