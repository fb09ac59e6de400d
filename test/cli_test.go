package test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// cli runs the binary and returns its output and exit code.
func cli(t *testing.T, args ...string) (string, int) {
	t.Helper()
	return cliIn(t, "", nil, args...)
}

// cliIn is cli run in directory dir ("": this one), with env added to
// this process's environment.
func cliIn(t *testing.T, dir string, env []string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Dir, cmd.Env = dir, append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	code := exitCode(err)
	if code < 0 {
		t.Fatalf("phasegate %v: %v", args, err)
	}
	return string(out), code
}

// The command line beside the daemon: probe with nothing listening, when
// serving and while draining; reclaim's dry run, its refusal beside a
// running daemon and its one-shot run after it; status as a table, as
// JSON and watching; the Slots API's verbs.
func TestProbeStatusAndReclaimCommands(t *testing.T) {
	h := newHost(t)
	h.leak(h.prefix, 1, 300)
	addr := freePort(t)

	// Nothing listens yet: probe cannot ask.
	if out, code := cli(t, "probe", "--addr="+addr, "--timeout=500ms"); code != 2 {
		t.Errorf("probe with no daemon: exit %d (%s), want 2", code, out)
	}
	// A dry run lists what a reclaim would take, and changes nothing.
	out, code := cli(t, "reclaim", "--dry-run", "--netns-dir="+h.netnsDir, "--slot-prefix="+h.prefix, "--slots=400", "--state-dir="+h.stateDir)
	if code != 0 || !strings.Contains(out, "300 leaked slots would be reclaimed") {
		t.Fatalf("reclaim --dry-run: exit %d\n%s", code, out)
	}
	if n := len(h.netnsFiles(h.prefix)); n != 300 {
		t.Fatalf("dry run changed the host: %d netns files left of 300", n)
	}

	d := start(t, nil, h.args(addr, "--slots=400")...)
	d.waitServing(time.Minute)

	// reclaim refuses beside a running daemon.
	out, code = cli(t, "reclaim", "--netns-dir="+h.netnsDir, "--slot-prefix="+h.prefix, "--slots=400", "--state-dir="+h.stateDir)
	if code != 1 || !strings.Contains(out, "holds") {
		t.Errorf("reclaim beside a daemon: exit %d (%s), want 1 naming the holder", code, out)
	}

	for _, args := range [][]string{{"probe", "--addr=" + addr}, {"probe", "--http", "--addr=" + addr}} {
		if out, code := cli(t, args...); code != 0 {
			t.Errorf("%v when serving: exit %d (%s)", args, code, out)
		}
	}
	checkStatusCommand(t, addr)
	checkSlotsCommands(t, d)
	checkBandwidthCommands(t, d)

	// While draining, probe says "not serving".
	d.signal(syscall.SIGTERM)
	waitFor(t, 10*time.Second, "probe to report draining", func() bool {
		_, code := cli(t, "probe", "--addr="+addr, "--timeout=500ms")
		return code != 0
	})
	if code := d.wait(30 * time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}

	// With no daemon, a one-shot reclaim takes the lock and cleans up what
	// no record accounts for; the warm slots the daemon kept stay.
	h.leak(h.prefix, 101, 50)
	out, code = cli(t, "reclaim", "--netns-dir="+h.netnsDir, "--slot-prefix="+h.prefix, "--slots=400", "--state-dir="+h.stateDir)
	if code != 0 || !strings.Contains(out, "found 50") || !strings.Contains(out, "idle slots recorded, left as they are") {
		t.Errorf("reclaim: exit %d\n%s", code, out)
	}
	h.stoppedCleanly(h.prefix, nil)
}

// checkStatusCommand checks `phasegate status` of a daemon serving at
// addr that reclaimed 300 slots: the table with every phase succeeded and
// reclaim's progress, --json, and --watch.
func checkStatusCommand(t *testing.T, addr string) {
	t.Helper()
	out, code := cli(t, "status", "--addr="+addr)
	if code != 0 {
		t.Fatalf("status: exit %d\n%s", code, out)
	}
	rows := lines(out)
	if !strings.HasPrefix(rows[0], "lifecycle serving since") || len(rows) < 9 {
		t.Fatalf("status table:\n%s", out)
	}
	for i, phase := range []string{"lock", "listen", "reclaim", "storage", "populate", "register", "serve"} {
		if f := strings.Fields(rows[2+i]); f[0] != phase || f[1] != "succeeded" {
			t.Errorf("status row %d = %q, want %s succeeded", i, rows[2+i], phase)
		}
	}
	if !strings.Contains(out, "300/300 namespaces") {
		t.Errorf("status does not show reclaim's progress:\n%s", out)
	}
	out, code = cli(t, "status", "--json", "--addr="+addr)
	var v struct {
		State  string `json:"state"`
		Phases []struct {
			Name  string `json:"name"`
			State string `json:"state"`
		} `json:"phases"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &v) != nil || v.State != "serving" || len(v.Phases) != 7 {
		t.Errorf("status --json: exit %d\n%s", code, out)
	}
	if out, code := cli(t, "status", "--watch", "--addr="+addr); code != 0 || !strings.HasPrefix(out, "serving") {
		t.Errorf("status --watch on a serving daemon: exit %d\n%s", code, out)
	}
}

// checkSlotsCommands checks the Slots API from the command line, as the
// README shows it: acquire, list, keepalive, a release with a wrong lease
// refused, the socket from the environment or a relative path, release.
func checkSlotsCommands(t *testing.T, d *daemon) {
	t.Helper()
	out, code := cli(t, "slots", "acquire", "sandbox-42", "--request-id=req-1", "--ttl=10m", "--socket="+d.control)
	var acq struct {
		Slot struct {
			Index int    `json:"index"`
			Owner string `json:"owner"`
		} `json:"slot"`
		LeaseID string `json:"lease_id"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &acq) != nil || acq.LeaseID == "" || acq.Slot.Owner != "sandbox-42" {
		t.Fatalf("slots acquire: exit %d\n%s", code, out)
	}
	idx := strconv.Itoa(acq.Slot.Index)
	out, code = cli(t, "slots", "list", "--socket="+d.control)
	var list struct {
		Slots []struct {
			Index int    `json:"index"`
			Owner string `json:"owner"`
		} `json:"slots"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &list) != nil || !slices.ContainsFunc(list.Slots, func(s struct {
		Index int    `json:"index"`
		Owner string `json:"owner"`
	}) bool {
		return s.Index == acq.Slot.Index && s.Owner == "sandbox-42"
	}) {
		t.Errorf("slots list: exit %d\n%s", code, out)
	}
	if out, code := cli(t, "slots", "keepalive", idx, acq.LeaseID, "--socket="+d.control); code != 0 || !strings.Contains(out, "expires_at") {
		t.Errorf("slots keepalive: exit %d\n%s", code, out)
	}
	if out, code := cli(t, "slots", "release", idx, "wrong-lease", "--socket="+d.control); code != 1 || !strings.Contains(out, "PermissionDenied") {
		t.Errorf("slots release with a wrong lease: exit %d\n%s", code, out)
	}
	// The socket from the environment, as every flag may be given, with
	// or without arguments after the verb; and a relative path, from the
	// directory it is relative to.
	dir, base := filepath.Split(d.control)
	for _, tc := range []struct {
		dir  string
		env  []string
		args []string
	}{
		{"", []string{"PHASEGATE_SOCKET=" + d.control}, []string{"slots", "list"}},
		{"", []string{"PHASEGATE_SOCKET=" + d.control}, []string{"slots", "get", idx}},
		{dir, nil, []string{"slots", "list", "--socket=" + base}},
		{dir, nil, []string{"slots", "list", "--socket=./" + base}},
		{dir, []string{"PHASEGATE_SOCKET=" + base}, []string{"slots", "list"}},
	} {
		if out, code := cliIn(t, tc.dir, tc.env, tc.args...); code != 0 || !strings.Contains(out, `"sandbox-42"`) {
			t.Errorf("%v %v in %q: exit %d\n%s", tc.env, tc.args, tc.dir, code, out)
		}
	}
	if out, code := cli(t, "slots", "release", idx, acq.LeaseID, "--socket="+d.control); code != 0 {
		t.Errorf("slots release: exit %d\n%s", code, out)
	}
}
