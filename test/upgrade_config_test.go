package test

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/phasegate/phasegate/internal/testcerts"
)

// livezWatch probes /livez on a new connection every 20 ms until stopped,
// counting the probes and those that got no HTTP answer (refused, reset,
// timed out): a closed port is one of those.
type livezWatch struct {
	probes, failed atomic.Int64
	mu             sync.Mutex
	errs           []string
	stop           chan struct{}
	wg             sync.WaitGroup
}

// watchLivez probes base+"/livez" ("http://addr", or "https://addr" with
// tc for its client).
func watchLivez(base string, tc *tls.Config) *livezWatch {
	w := &livezWatch{stop: make(chan struct{})}
	c := http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{DisableKeepAlives: true, TLSClientConfig: tc}}
	w.wg.Go(func() {
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-w.stop:
				return
			case <-t.C:
			}
			w.probes.Add(1)
			resp, err := c.Get(base + "/livez")
			if err == nil {
				resp.Body.Close()
				continue
			}
			w.failed.Add(1)
			w.mu.Lock()
			if len(w.errs) < 3 {
				w.errs = append(w.errs, err.Error())
			}
			w.mu.Unlock()
		}
	})
	return w
}

// finish stops the probes and returns how many there were, how many got no
// answer, and the first errors.
func (w *livezWatch) finish() (probes, failed int64, errs []string) {
	close(w.stop)
	w.wg.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.probes.Load(), w.failed.Load(), w.errs
}

// lifecycleState returns the state base+"/debug/lifecycle" reports, or ""
// when it does not answer.
func lifecycleState(c *http.Client, base string) string {
	resp, err := c.Get(base + "/debug/lifecycle")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	var v struct{ State string }
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&v) != nil {
		return ""
	}
	return v.State
}

// waitNewImage waits until the daemon's new image serves (its second
// "serving" line) and fails the test, with what the probes of live saw,
// when the daemon exits instead.
func waitNewImage(t *testing.T, d *daemon, live *livezWatch) {
	t.Helper()
	waitFor(t, 2*time.Minute, "the new image to serve, or the daemon to exit", func() bool {
		select {
		case <-d.Done():
			return true
		default:
		}
		return strings.Count(d.Output(), "msg=serving ") >= 2
	})
	select {
	case <-d.Done():
		probes, failed, errs := live.finish()
		t.Fatalf("the daemon exited %d during the upgrade and the port closed: %d of %d /livez probes unanswered %v\n%s",
			d.wait(time.Minute), failed, probes, errs, d.Output())
	default:
	}
}

// finishLivez lets live probe the new image a little, then stops it and
// fails the test when a probe went unanswered.
func finishLivez(t *testing.T, d *daemon, live *livezWatch) {
	t.Helper()
	served := live.probes.Load()
	waitFor(t, time.Minute, "probes of the new image", func() bool { return live.probes.Load() >= served+10 })
	probes, failed, errs := live.finish()
	t.Logf("/livez across the upgrade: %d probes, %d unanswered %v", probes, failed, errs)
	if failed != 0 {
		t.Errorf("the port did not answer %d of %d /livez probes across the upgrade: %v\n%s", failed, probes, errs, d.Output())
	}
}

func sha256Of(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// An upgrade whose policy file turns invalid during the drain — made 0666
// by an editor or a config tool, or half written — still ends with the
// new image serving: the port answers /livez throughout and after, the
// pid is the same, the new image says it took the policy the old one read
// and checked at SIGHUP, and that policy is in force: nobody may act for
// the owners it grants, and no more for those it revoked before the
// SIGHUP. A SIGHUP while the file is invalid (0666, a symlink, half
// written) is refused and the daemon keeps serving. Before the handover,
// the new image read the path again and exited 2: the port closed.
func TestUpgradeWithThePolicyFileBrokenDuringTheDrain(t *testing.T) {
	const before = `{"principals": [{"uid": 65534, "owners": ["kept-*", "revoked-*"]}]}`
	for _, tc := range []struct {
		name  string
		spoil func(path string) error
	}{
		{"made 0666", func(path string) error { return os.Chmod(path, 0o666) }},
		{"half written", func(path string) error {
			// In place, as a tool that truncates and writes does: the
			// reader between the two sees half a policy.
			return os.WriteFile(path, []byte(policyAtHup[:len(policyAtHup)/2]), 0o644)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pub := newPublicDir(t)
			h := newHost(t)
			addr := freePort(t)
			policy := filepath.Join(t.TempDir(), "policy.json") // root's, 0700
			writePolicyFile(t, policy, before)
			sock := filepath.Join(pub.dir, "control.sock")
			S := "--socket=" + sock
			d := start(t, nil, h.args(addr, "--slots=64", "--pool-size=2", "--drain-delay=3s",
				"--control-socket="+sock, "--control-group=nogroup", "--control-policy="+policy)...)
			d.waitServing(time.Minute)
			pid := d.Pid()
			acquire := func(owner string) (string, int) {
				return pub.as(t, "nobody", "", "slots", "acquire", owner, "--ttl=10m", S)
			}
			if out, code := acquire("revoked-1"); code != 0 {
				t.Fatalf("before the revocation nobody may act for revoked-*: exit %d %s", code, out)
			}

			// The operator revokes revoked-* and asks for the upgrade.
			writePolicyFile(t, policy, policyAtHup)
			execs := upgradeWithThePolicySpoiled(t, d, addr, policy, tc.spoil)

			// The policy in force is the one read at SIGHUP.
			if out, code := acquire("kept-1"); code != 0 {
				t.Errorf("nobody acquiring for kept-1, which the policy grants: exit %d %s", code, out)
			}
			out, code := acquire("revoked-2")
			wantRefused(t, "nobody acquiring for revoked-2, revoked before the SIGHUP", out, code, "PermissionDenied")

			// While the file is invalid, a SIGHUP is refused and the daemon
			// keeps serving; a symlink to a good policy is refused too.
			sighupRefused(t, d, tc.name, pid, execs)
			good := filepath.Join(filepath.Dir(policy), "good.json")
			if err := os.WriteFile(good, []byte(policyAtHup), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Remove(policy); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(good, policy); err != nil {
				t.Fatal(err)
			}
			sighupRefused(t, d, "a symlink", pid, execs)

			d.signal(syscall.SIGTERM)
			if code := d.wait(time.Minute); code != 0 {
				t.Fatalf("exit %d", code)
			}
			h.decommission(h.prefix)
		})
	}
}

// policyAtHup is the policy the operator writes before the SIGHUP: it
// revokes revoked-* and keeps kept-*.
const policyAtHup = `{"principals": [{"uid": 65534, "owners": ["kept-*"]}]}` + "\n"

// writePolicyFile replaces the policy file at path with body, as an
// editor saving through a rename does.
func writePolicyFile(t *testing.T, path, body string) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// upgradeWithThePolicySpoiled sends SIGHUP, spoils the policy file while
// the old image drains, and checks the port answered throughout, the new
// image serves under the same pid and says it took the policy read at
// SIGHUP; it returns how many execs the log showed before.
func upgradeWithThePolicySpoiled(t *testing.T, d *daemon, addr, policy string, spoil func(string) error) int {
	t.Helper()
	pid := d.Pid()
	live := watchLivez("http://"+addr, nil)
	execs := strings.Count(d.Output(), "upgrading in place: exec")
	d.signal(syscall.SIGHUP)
	waitFor(t, time.Minute, "the daemon to report draining", func() bool {
		return lifecycleState(&http.Client{Timeout: 2 * time.Second}, "http://"+addr) == "draining"
	})
	if err := spoil(policy); err != nil {
		t.Fatal(err)
	}
	if strings.Count(d.Output(), "upgrading in place: exec") != execs {
		t.Fatal("the policy file was broken after the exec, not during the drain: lengthen --drain-delay")
	}
	waitNewImage(t, d, live)
	d.waitServing(time.Minute)
	finishLivez(t, d, live)
	if d.Pid() != pid {
		t.Fatalf("pid %d after the upgrade, want %d", d.Pid(), pid)
	}
	took := fmt.Sprintf("path=%s size=%d sha256=%s", policy, len(policyAtHup), sha256Of([]byte(policyAtHup)))
	if out := d.Output(); !strings.Contains(out, "configuration file taken from the previous image") || !strings.Contains(out, took) {
		t.Errorf("the new image does not say it took the policy read at SIGHUP (%s):\n%s", took, out)
	}
	return execs
}

// sighupRefused sends SIGHUP while the policy file is invalid (how says
// what) and checks it is refused: the daemon keeps serving under pid, and
// no exec follows the one upgrade made (execs before it).
func sighupRefused(t *testing.T, d *daemon, what string, pid, execs int) {
	t.Helper()
	const refused = "upgrade refused"
	n := strings.Count(d.Output(), refused)
	d.signal(syscall.SIGHUP)
	waitFor(t, time.Minute, "the SIGHUP to be refused ("+what+")", func() bool {
		return strings.Count(d.Output(), refused) > n
	})
	if code, _, err := d.get("/readyz"); err != nil || code != http.StatusOK {
		t.Fatalf("%s: not serving after a refused upgrade: %d %v", what, code, err)
	}
	if d.Pid() != pid || strings.Count(d.Output(), "upgrading in place: exec") != execs+1 {
		t.Fatalf("%s: the upgrade went ahead", what)
	}
}

// Nomad re-renders the certificate and sends SIGHUP: an upgrade whose key
// file is truncated during the drain (the next render beginning) still
// ends with the new image serving, on the port that answered throughout,
// with the certificate renewed before the SIGHUP. Before the handover
// the new image read the truncated key and exited 2: the port closed.
func TestUpgradeWithTheTLSKeyTruncatedDuringTheDrain(t *testing.T) {
	old, renewed := newCertSet(t), newCertSet(t)
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	install := func(s *testcerts.Set) {
		t.Helper()
		copyFile(t, s.ServerCert, cert, 0o644)
		copyFile(t, s.ServerKey, key, 0o600)
	}
	install(old)
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(readFile(t, old.CAFile))
	roots.AppendCertsFromPEM(readFile(t, renewed.CAFile))
	tc := &tls.Config{RootCAs: roots}
	https := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: tc, DisableKeepAlives: true}}
	h := newHost(t)
	addr := freePort(t)
	base := "https://" + addr
	d := start(t, nil, h.args(addr, "--slots=64", "--pool-size=2", "--drain-delay=3s", "--tls-cert="+cert, "--tls-key="+key)...)
	waitFor(t, time.Minute, "HTTPS /readyz to answer 200", func() bool {
		resp, err := https.Get(base + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	pid := d.Pid()
	if servedCert(t, addr, tc) != sha256Of(old.Server.Certificate[0]) {
		t.Fatal("the port does not serve the certificate installed at the start")
	}

	install(renewed) // the renewal, then the SIGHUP
	live := watchLivez(base, tc)
	execs := strings.Count(d.Output(), "upgrading in place: exec")
	d.signal(syscall.SIGHUP)
	waitFor(t, time.Minute, "the daemon to report draining", func() bool {
		return lifecycleState(https, base) == "draining"
	})
	if err := os.Truncate(key, 0); err != nil {
		t.Fatal(err)
	}
	if strings.Count(d.Output(), "upgrading in place: exec") != execs {
		t.Fatal("the key was truncated after the exec, not during the drain: lengthen --drain-delay")
	}
	waitNewImage(t, d, live)
	finishLivez(t, d, live)
	if d.Pid() != pid {
		t.Fatalf("pid %d after the upgrade, want %d", d.Pid(), pid)
	}
	if servedCert(t, addr, tc) != sha256Of(renewed.Server.Certificate[0]) {
		t.Error("the new image does not serve the certificate renewed before the SIGHUP")
	}
	out := d.Output()
	for _, f := range []string{cert, key} {
		if !strings.Contains(out, "configuration file taken from the previous image") || !strings.Contains(out, "path="+f+" ") {
			t.Errorf("the new image does not say it took %s as read at SIGHUP:\n%s", f, out)
		}
	}
	d.signal(syscall.SIGTERM)
	if code := d.wait(time.Minute); code != 0 {
		t.Fatalf("exit %d", code)
	}
}

func newCertSet(t *testing.T) *testcerts.Set {
	t.Helper()
	s, err := testcerts.New()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.WriteFiles(t.TempDir()); err != nil {
		t.Fatal(err)
	}
	return s
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// servedCert returns the SHA-256 of the certificate the port serves, to
// compare with that of a testcerts.Set's server certificate.
func servedCert(t *testing.T, addr string, tc *tls.Config) string {
	t.Helper()
	c, err := tls.Dial("tcp", addr, tc)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return sha256Of(c.ConnectionState().PeerCertificates[0].Raw)
}

// upgradeWithBinaryChanged starts a daemon from a copy of the binary, with
// a policy file, installs a new copy at its path (renamed over it, as an
// operator's upgrade does), sends SIGHUP and, once the daemon reports
// draining, calls during(bin). It returns the daemon once its next image
// serves, having checked that the port answered /livez throughout, the
// pid is the same and the next image took the policy read at SIGHUP.
func upgradeWithBinaryChanged(t *testing.T, during func(bin string) error) *daemon {
	t.Helper()
	h := newHost(t)
	bin := filepath.Join(t.TempDir(), "phasegate")
	run(t, "cp", binary, bin)
	policy := filepath.Join(t.TempDir(), "policy.json")
	const body = `{"principals": [{"uid": 65534, "owners": ["kept-*"]}]}`
	if err := os.WriteFile(policy, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := freePort(t)
	d := startBinary(t, bin, nil, h.args(addr, "--slots=64", "--pool-size=2", "--drain-delay=3s", "--control-policy="+policy)...)
	d.waitServing(time.Minute)
	pid := d.Pid()
	run(t, "cp", binary, bin+".new")
	if err := os.Rename(bin+".new", bin); err != nil {
		t.Fatal(err)
	}

	live := watchLivez("http://"+addr, nil)
	d.signal(syscall.SIGHUP)
	waitFor(t, time.Minute, "the daemon to report draining", func() bool {
		return lifecycleState(&http.Client{Timeout: 2 * time.Second}, "http://"+addr) == "draining"
	})
	if err := during(bin); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(d.Output(), "upgrading in place: exec") {
		t.Fatal("the binary was changed after the exec, not during the drain: lengthen --drain-delay")
	}
	waitNewImage(t, d, live)
	d.waitServing(time.Minute)
	finishLivez(t, d, live)
	if d.Pid() != pid {
		t.Fatalf("pid %d after the upgrade, want %d", d.Pid(), pid)
	}
	if took := fmt.Sprintf("path=%s size=%d sha256=%s", policy, len(body), sha256Of([]byte(body))); !strings.Contains(d.Output(), took) {
		t.Errorf("the next image does not say it took the policy read at SIGHUP (%s):\n%s", took, d.Output())
	}
	t.Cleanup(func() {
		d.signal(syscall.SIGTERM)
		if code := d.wait(time.Minute); code != 0 {
			t.Errorf("exit %d", code)
		}
	})
	return d
}

// The binary checked at SIGHUP is the one executed: one put at the path
// during the drain (here a script that exits 3) is not, and the checked
// one serves. Before, the exec took whatever the path held then: the
// script ran, exited 3, and the port closed.
func TestUpgradeExecutesTheBinaryCheckedAtSIGHUP(t *testing.T) {
	d := upgradeWithBinaryChanged(t, func(bin string) error {
		if err := os.WriteFile(bin+".broken", []byte("#!/bin/sh\necho broken build >&2\nexit 3\n"), 0o755); err != nil {
			return err
		}
		return os.Rename(bin+".broken", bin)
	})
	if out := d.Output(); strings.Contains(out, "broken build") || strings.Contains(out, "exec of the new binary failed") {
		t.Errorf("the binary put at the path during the drain was executed:\n%s", out)
	}
}

// The binary checked at SIGHUP cannot be executed any more when the drain
// ends (here made 0644): the exec fails, and the image that was running
// (/proc/self/exe) is executed instead, as the same pid, handed the same
// port and the policy read at SIGHUP; the port answers throughout. A new
// image that fails its start instead exits like any failed start, and the
// port closes until the supervisor starts the daemon again (DESIGN.md,
// section 7).
func TestUpgradeFallsBackToTheRunningImageWhenTheExecFails(t *testing.T) {
	d := upgradeWithBinaryChanged(t, func(bin string) error { return os.Chmod(bin, 0o644) })
	if !strings.Contains(d.Output(), "exec of the new binary failed; restarting the running one") {
		t.Errorf("the failed exec is not logged:\n%s", d.Output())
	}
}
