package test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
	"github.com/phasegate/phasegate/app"
	"github.com/phasegate/phasegate/server"
)

// unit is a parsed systemd unit file: section → key → values, in order
// (a key may repeat: Environment=).
type unit map[string]map[string][]string

// parseUnit reads a unit file; what it does not emulate (continued lines)
// fails the test.
func parseUnit(t *testing.T, path string) unit {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	u := unit{}
	section := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "["):
			section = strings.Trim(line, "[]")
			u[section] = map[string][]string{}
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" || strings.HasSuffix(line, `\`) {
				t.Fatalf("%s: line %q is not emulated", path, line)
			}
			k = strings.TrimSpace(k)
			u[section][k] = append(u[section][k], strings.TrimSpace(v))
		}
	}
	return u
}

// get is a key's value (the last, as systemd takes for single values).
func (u unit) get(section, key string) string {
	vs := u[section][key]
	if len(vs) == 0 {
		return ""
	}
	return vs[len(vs)-1]
}

// words splits a command line or an assignment list; the files use no
// quoting, which the test does not emulate.
func words(t *testing.T, s string) []string {
	t.Helper()
	if strings.ContainsAny(s, `"'\%`) {
		t.Fatalf("%q: quoting and specifiers are not emulated", s)
	}
	return strings.Fields(s)
}

// systemdTime parses a systemd time span: "30s", "5min 30s", "90" (seconds).
func systemdTime(t *testing.T, s string) time.Duration {
	t.Helper()
	units := map[string]time.Duration{
		"us": time.Microsecond, "ms": time.Millisecond, "": time.Second, "s": time.Second, "sec": time.Second,
		"m": time.Minute, "min": time.Minute, "h": time.Hour, "hr": time.Hour,
	}
	var total time.Duration
	for _, w := range strings.Fields(s) {
		i := strings.IndexFunc(w, func(r rune) bool { return r < '0' || r > '9' })
		if i < 0 {
			i = len(w)
		}
		n, err := strconv.Atoi(w[:i])
		u, ok := units[w[i:]]
		if err != nil || !ok {
			t.Fatalf("time span %q is not emulated", s)
		}
		total += time.Duration(n) * u
	}
	if total == 0 {
		t.Fatalf("time span %q: zero (or infinity) bounds nothing", s)
	}
	return total
}

// systemdService is what the tests take from the unit files.
type systemdService struct {
	svc, sock unit
	args      []string // ExecStart's arguments, after the binary
	env       []string // Environment=
	listen    string   // ListenStream=
	fdName    string   // FileDescriptorName=
	backlog   int      // Backlog=
}

func readSystemdUnits(t *testing.T) systemdService {
	t.Helper()
	s := systemdService{
		svc:  parseUnit(t, "../deploy/systemd/phasegate.service"),
		sock: parseUnit(t, "../deploy/systemd/phasegate.socket"),
	}
	exec := words(t, s.svc.get("Service", "ExecStart"))
	if len(exec) < 2 || exec[0] != productionBinary {
		t.Fatalf("ExecStart %q: the test runs the binary under test in place of %s", exec, productionBinary)
	}
	s.args = exec[1:]
	installSysusers(t) // --control-group names the group it declares
	for _, e := range s.svc["Service"]["Environment"] {
		s.env = append(s.env, words(t, e)...)
	}
	s.listen = s.sock.get("Socket", "ListenStream")
	s.fdName = s.sock.get("Socket", "FileDescriptorName")
	if b := s.sock.get("Socket", "Backlog"); b != "" {
		var err error
		if s.backlog, err = strconv.Atoi(b); err != nil || s.backlog <= 0 {
			t.Fatalf("Backlog=%s", b)
		}
	}
	return s
}

// verifyUnits runs systemd-analyze verify on copies of the unit files
// whose binary is the one under test, and fails on anything it says:
// systemd ignores what it does not know with a warning, and so would the
// test's own parser.
func verifyUnits(t *testing.T) {
	analyze := lookTool(t, "systemd-analyze", "apt-get install systemd")
	dir := t.TempDir()
	var paths []string
	for _, name := range []string{"phasegate.socket", "phasegate.service"} {
		src := pemFile(t, filepath.Join("../deploy/systemd", name))
		p := filepath.Join(dir, name)
		writeFile(t, p, bytes.ReplaceAll(src, []byte(productionBinary), []byte(binary)), 0o644)
		paths = append(paths, p)
	}
	out, err := exec.Command(analyze, append([]string{"verify"}, paths...)...).CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
}

// TestDeploySystemd runs the service unit's ExecStart the way systemd
// would with the socket unit: under systemd-socket-activate with the
// socket's address and descriptor name, with the unit's environment, and
// the test playing the service manager's end of sd_notify (NOTIFY_SOCKET,
// WATCHDOG_USEC from WatchdogSec). It checks the port listens before the
// daemon runs and is served by the daemon after, READY=1 and the start
// budget the daemon asks for, a reload (ExecReload, the in-place upgrade)
// that keeps the pid and refuses no connection with WATCHDOG=1 never
// further apart than WatchdogSec, and an orderly stop within
// TimeoutStopSec.
func TestDeploySystemd(t *testing.T) {
	activate := lookTool(t, "systemd-socket-activate", "apt-get install systemd")
	verifyUnits(t)
	u := readSystemdUnits(t)
	reload := u.checkServiceShape(t)

	n := newNode(t)
	h := newHost(t)
	env := append(baseEnv(), u.env...)
	r := n.check(env, u.args)
	b := u.budgets(t, n, env, r)

	notify := newNotifySocket(t)
	d := startSocketActivated(t, n, h, u, env, activate, b, notify)
	extend := checkNotifiedStart(t, notify, r, b)
	checkActivatedServing(t, n, d, h, u)
	notify.next(t, 0, "WATCHDOG", b.watchdog)
	reloadUnderWatchdog(t, n, d, u, reload, b, notify)

	from := notify.count()
	stopAt := time.Now()
	d.signal(b.killSignal)
	d.waitExit(b.stopTimeout, "TimeoutStopSec")
	t.Logf("stop budget %v, TimeoutStopSec %v, stopped in %v; start budget %v, TimeoutStartSec %v, EXTEND_TIMEOUT_USEC %s",
		r.stopBudget(), b.stopTimeout, time.Since(stopAt).Round(time.Millisecond), r.startBudget(t), b.startTimeout, extend)
	notify.next(t, from, "STOPPING", time.Second)
}

// checkServiceShape checks what the service and socket units must say for
// the daemon (Type=notify, the socket required, its descriptor's name, a
// backlog, the records kept across a stop, a stuck daemon killed) and
// returns ExecReload, which must be the in-place upgrade.
func (u systemdService) checkServiceShape(t *testing.T) []string {
	t.Helper()
	if u.svc.get("Service", "Type") != "notify" {
		t.Errorf("Type=%s, want notify: started must mean serving", u.svc.get("Service", "Type"))
	}
	if a := u.svc.get("Service", "NotifyAccess"); a != "main" && a != "all" {
		t.Errorf("NotifyAccess=%q: the daemon's notifications would be dropped", a)
	}
	for _, k := range []string{"Requires", "After"} {
		if !strings.Contains(" "+strings.Join(u.svc["Unit"][k], " ")+" ", " phasegate.socket ") {
			t.Errorf("%s= does not name phasegate.socket", k)
		}
	}
	if u.fdName != app.ListenFDName {
		t.Errorf("FileDescriptorName=%q, the daemon looks for %q", u.fdName, app.ListenFDName)
	}
	if u.backlog == 0 {
		t.Error("no Backlog=: connections made while no daemon accepts wait in it")
	}
	if p := u.svc.get("Service", "RuntimeDirectoryPreserve"); p != "yes" {
		t.Errorf("RuntimeDirectoryPreserve=%q: a stop would delete the leases' records while their slots live on", p)
	}
	if km := u.svc.get("Service", "KillMode"); km == "none" {
		t.Error("KillMode=none leaves a stuck daemon running")
	}
	reload := words(t, u.svc.get("Service", "ExecReload"))
	if len(reload) != 3 || reload[0] != "/bin/kill" || reload[1] != "-HUP" || reload[2] != "$MAINPID" {
		t.Fatalf("ExecReload=%q, want /bin/kill -HUP $MAINPID (the in-place upgrade)", reload)
	}
	return reload
}

// systemdBudgets are the service unit's bounds as systemd applies them.
type systemdBudgets struct {
	stopTimeout, startTimeout, watchdog time.Duration
	killSignal                          syscall.Signal
	nofile                              string // prlimit's --nofile=, from LimitNOFILE=
}

// budgets reads the unit's bounds and checks them against the daemon's
// resolved settings r: its address and state directory, its stop and
// start budgets, and the port's full bound of connections under
// LimitNOFILE=.
func (u systemdService) budgets(t *testing.T, n *node, env []string, r resolved) systemdBudgets {
	t.Helper()
	if r.Listen != u.listen {
		t.Errorf("ListenStream=%s but --listen=%s", u.listen, r.Listen)
	}
	if rd := u.svc.get("Service", "RuntimeDirectory"); "/run/"+rd != r.StateDir {
		t.Errorf("RuntimeDirectory=%s but --state-dir=%s", rd, r.StateDir)
	}
	b := systemdBudgets{
		stopTimeout:  systemdTime(t, u.svc.get("Service", "TimeoutStopSec")),
		startTimeout: systemdTime(t, u.svc.get("Service", "TimeoutStartSec")),
	}
	if b.stopTimeout <= r.stopBudget() {
		t.Errorf("TimeoutStopSec %v does not exceed the daemon's stop budget %v: systemd would SIGKILL an orderly stop", b.stopTimeout, r.stopBudget())
	}
	if b.startTimeout < r.startBudget(t) {
		t.Errorf("TimeoutStartSec %v < --start-timeout plus the stop budget (%v): systemd would kill a start the daemon still bounds itself", b.startTimeout, r.startBudget(t))
	}
	// LimitNOFILE=, as systemd sets it (soft and hard): it leaves the port
	// its full bound after the daemon's own reserve.
	b.nofile = "--nofile=" + u.svc.get("Service", "LimitNOFILE")
	if lr := n.checkUnder(env, []string{"prlimit", b.nofile}, u.args); lr.PortConns != server.DefaultMaxConns {
		t.Errorf("LimitNOFILE=%s: the port may hold %d connections (open files %d), want its full bound %d",
			u.svc.get("Service", "LimitNOFILE"), lr.PortConns, lr.OpenFiles, server.DefaultMaxConns)
	}
	b.watchdog = systemdTime(t, u.svc.get("Service", "WatchdogSec"))
	b.killSignal = syscall.SIGTERM
	if s := u.svc.get("Service", "KillSignal"); s != "" {
		b.killSignal = signalNamed(t, s)
	}
	return b
}

// startSocketActivated runs ExecStart under systemd-socket-activate as
// systemd would with the socket unit, and checks that the socket listens
// before the daemon runs and that the first connection starts the daemon,
// which answers it.
func startSocketActivated(t *testing.T, n *node, h *host, u systemdService, env []string, activate string, b systemdBudgets, notify *notifySocket) *daemon {
	t.Helper()
	cmd := []string{"prlimit", b.nofile, activate, "-l", u.listen, "--fdname=" + u.fdName,
		"-E", "NOTIFY_SOCKET=" + notify.path,
		"-E", fmt.Sprintf("WATCHDOG_USEC=%d", b.watchdog.Microseconds())}
	for _, e := range env {
		cmd = append(cmd, "-E", e)
	}
	cmd = append(append(append(cmd, binary), u.args...), confine(h)...)
	d := n.start(u.listen, n.command(baseEnv(), cmd...))

	// The socket listens while the process is still systemd-socket-activate:
	// no connection has come, so it has not executed the daemon yet.
	waitPass(t, time.Minute, "the activation socket to listen", func() error {
		if !d.running() {
			t.Fatalf("systemd-socket-activate exited: %v", d.Err())
		}
		return n.listening(d.Pid(), u.listen)
	})
	if exe, want := d.exe(), mustEval(t, activate); exe != want {
		t.Fatalf("before the first connection the process runs %s, want %s", exe, want)
	}
	// The first connection starts the daemon, which answers it.
	resp, err := rawGet(n, u.listen, "/livez")
	if err != nil || !strings.HasPrefix(resp, "HTTP/1.1 200") {
		t.Fatalf("the first connection, made before the daemon ran: %v %q", err, resp)
	}
	if exe, want := d.exe(), mustEval(t, binary); exe != want {
		t.Errorf("after the first connection the process runs %s, want the daemon %s", exe, want)
	}
	return d
}

// checkNotifiedStart waits for READY=1 and checks the start budgets the
// daemon asked for (EXTEND_TIMEOUT_USEC) on the way; it returns the first
// of them for the log.
func checkNotifiedStart(t *testing.T, notify *notifySocket, r resolved, b systemdBudgets) string {
	t.Helper()
	notify.next(t, 0, "READY", serveTimeout)
	ext := notify.all(0, "EXTEND_TIMEOUT_USEC")
	extend := "none"
	if len(ext) == 0 {
		t.Error("no EXTEND_TIMEOUT_USEC while starting")
	} else {
		extend = ext[0].fields["EXTEND_TIMEOUT_USEC"] + "µs"
	}
	for _, m := range ext {
		if v := usec(t, m.fields["EXTEND_TIMEOUT_USEC"]); v <= 0 || v > r.startBudget(t) || v > b.startTimeout {
			t.Errorf("EXTEND_TIMEOUT_USEC=%v: want within (0, start budget %v] and within TimeoutStartSec %v", v, r.startBudget(t), b.startTimeout)
		}
	}
	return extend
}

// checkActivatedServing checks the daemon serves HTTP and gRPC on the
// activated socket (having bound none of its own), guards its control
// socket, and lets a member of the socket's group use the Slots API.
func checkActivatedServing(t *testing.T, n *node, d *daemon, h *host, u systemdService) {
	t.Helper()
	waitPass(t, serveTimeout, "the daemon to serve on the activated socket", func() error {
		code, err := n.httpGet("http://"+u.listen+"/readyz", nil, 2*time.Second)
		if err == nil && code != 200 {
			err = fmt.Errorf("/readyz %d", code)
		}
		return err
	})
	if st, err := n.grpcHealth(u.listen, "", insecure.NewCredentials(), 5*time.Second); err != nil || st != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("grpc health: %v %v", st, err)
	}
	if strings.Contains(d.Output(), "address already in use") {
		t.Errorf("the daemon bound its own socket:\n%s", d.Output())
	}
	assertControlGuarded(t, n, d, h, nil)
	// A member of the socket's group (the orchestrator's user, as the
	// unit's comments say to set it up) uses the Slots API.
	reachable(t, h.stateDir)
	member := exec.Command("runuser", "-u", "nobody", "-g", "phasegate", "--", newPublicDir(t).binary, "slots", "list", "--socket="+d.control)
	if out, err := member.CombinedOutput(); err != nil || !strings.Contains(string(out), `"slots"`) {
		t.Errorf("a member of group phasegate on the control socket: %v %s", err, out)
	}
}

// reloadUnderWatchdog plays systemctl reload (ExecReload with $MAINPID,
// the daemon's pid) and checks the reload keeps the process and the
// control socket, refuses no connection, and never leaves WATCHDOG=1
// further apart than WatchdogSec.
func reloadUnderWatchdog(t *testing.T, n *node, d *daemon, u systemdService, reload []string, b systemdBudgets, notify *notifySocket) {
	t.Helper()
	pid := d.Pid()
	from := notify.count()
	reloadAt := time.Now()
	refused := watchRefusals(n, u.listen)
	run(t, reload[0], reload[1], strconv.Itoa(pid))
	notify.next(t, from, "READY", serveTimeout)
	notify.next(t, from, "WATCHDOG", b.watchdog)
	if n := refused(); n > 0 {
		t.Errorf("%d connections refused during the reload", n)
	}
	if !d.running() || d.Pid() != pid {
		t.Fatalf("the reload did not keep the process: %v", d.Err())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := d.slots().List(ctx, &phasegatev1.ListRequest{}); err != nil {
		t.Errorf("the control socket after the reload (handed to the new image): %v", err)
	}
	// The gap systemd's watchdog sees: from the old image's last WATCHDOG=1
	// before the SIGHUP to the new image's first.
	var before, after time.Time
	for _, m := range notify.all(0, "WATCHDOG") {
		if m.at.Before(reloadAt) {
			before = m.at
		} else if after.IsZero() {
			after = m.at
		}
	}
	if before.IsZero() || after.IsZero() {
		t.Fatalf("no WATCHDOG=1 on one side of the reload (before %v, after %v)", before, after)
	}
	widest := after.Sub(before)
	if widest >= b.watchdog {
		t.Errorf("WATCHDOG=1 %v apart across the reload, WatchdogSec=%v: systemd would kill the daemon", widest, b.watchdog)
	}
	t.Logf("reload: READY=1 again %v after SIGHUP, same pid, no connection refused, WATCHDOG=1 gap across it %v (WatchdogSec %v)",
		time.Since(reloadAt).Round(time.Millisecond), widest.Round(time.Millisecond), b.watchdog)
}

// TestDeploySystemdRestartKeepsThePort plays `systemctl restart` with the
// socket unit: the test holds the listening socket as systemd does (the
// unit's address and Backlog=), hands it to ExecStart as systemd would
// (LISTEN_FDS, LISTEN_PID, LISTEN_FDNAMES), stops the daemon with
// KillSignal and starts a new one on the same socket. No connection is
// refused meanwhile, and a request sent while no daemon runs is answered
// by the next.
func TestDeploySystemdRestartKeepsThePort(t *testing.T) {
	u := readSystemdUnits(t)
	n := newNode(t)
	h := newHost(t)
	if u.backlog == 0 {
		t.Fatal("no Backlog= in the socket unit")
	}
	sock := n.listen(u.listen, u.backlog)
	env := append(baseEnv(), u.env...)
	env = append(env, "LISTEN_FDS=1", "LISTEN_FDNAMES="+u.fdName)
	killSignal := syscall.SIGTERM
	if s := u.svc.get("Service", "KillSignal"); s != "" {
		killSignal = signalNamed(t, s)
	}
	stopTimeout := systemdTime(t, u.svc.get("Service", "TimeoutStopSec"))
	startService := func() *daemon {
		// systemd sets LISTEN_PID to the pid that execs ExecStart: the
		// shell's, which exec keeps.
		argv := append(append([]string{"/bin/sh", "-c", `LISTEN_PID=$$ exec "$0" "$@"`, binary}, u.args...), confine(h)...)
		cmd := n.command(env, argv...)
		cmd.ExtraFiles = []*os.File{sock}
		return n.start(u.listen, cmd)
	}
	serving := func(d *daemon) {
		waitPass(t, serveTimeout, "the daemon to serve", func() error {
			if !d.running() {
				t.Fatalf("the daemon exited: %v\n%s", d.Err(), d.Output())
			}
			code, err := n.httpGet("http://"+u.listen+"/readyz", nil, 2*time.Second)
			if err == nil && code != 200 {
				err = fmt.Errorf("/readyz %d", code)
			}
			return err
		})
	}

	d1 := startService()
	serving(d1)
	refused := watchRefusals(n, u.listen)
	stoppedAt := time.Now()
	d1.signal(killSignal)
	d1.waitExit(stopTimeout, "TimeoutStopSec")
	// No daemon runs: the connection is accepted by the kernel into the
	// socket's backlog, and the request waits there.
	pending, err := sendGet(n, u.listen, "/livez")
	if err != nil {
		t.Fatalf("connecting while no daemon runs: %v", err)
	}
	defer pending.Close()
	d2 := startService()
	serving(d2)
	t.Logf("restart: %v from SIGTERM to the next daemon serving", time.Since(stoppedAt).Round(time.Millisecond))
	if resp, err := readStatus(pending); err != nil || !strings.HasPrefix(resp, "HTTP/1.1 200") {
		t.Errorf("the request made between the two daemons: %v %q", err, resp)
	}
	if k := refused(); k > 0 {
		t.Errorf("%d connections refused during the restart", k)
	}
	d2.signal(killSignal)
	d2.waitExit(stopTimeout, "TimeoutStopSec")
}

// watchRefusals connects to addr from inside the node every 20 ms until
// the returned function is called, which returns how many connections
// failed.
func watchRefusals(n *node, addr string) func() int {
	var failed atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			ctx, cancel := contextTimeout(2 * time.Second)
			c, err := n.dial(ctx, "tcp", addr)
			cancel()
			if err != nil {
				failed.Add(1)
				continue
			}
			c.Close()
		}
	})
	return func() int {
		close(stop)
		wg.Wait()
		return int(failed.Load())
	}
}

// sendGet connects from inside the node and sends one HTTP/1.1 GET,
// without waiting for the answer: the connection may sit in a backlog
// until a daemon accepts it.
func sendGet(n *node, addr, path string) (net.Conn, error) {
	ctx, cancel := contextTimeout(10 * time.Second)
	defer cancel()
	c, err := n.dial(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	_ = c.SetDeadline(time.Now().Add(serveTimeout))
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: phasegate\r\nConnection: close\r\n\r\n", path); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// readStatus reads the status line of the answer on c.
func readStatus(c net.Conn) (string, error) {
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line), err
}

// rawGet is sendGet and readStatus on a connection of its own.
func rawGet(n *node, addr, path string) (string, error) {
	c, err := sendGet(n, addr, path)
	if err != nil {
		return "", err
	}
	defer c.Close()
	return readStatus(c)
}

// listening reports whether process pid is in the node's namespace (it
// starts as nsenter, in this machine's) and a TCP socket listens on addr
// there (its /proc/<pid>/net/tcp).
func (n *node) listening(pid int, addr string) error {
	var ns, own unix.Stat_t
	if err := unix.Stat(n.ns, &ns); err != nil {
		return err
	}
	if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &own); err != nil {
		return err
	}
	if own.Ino != ns.Ino || own.Dev != ns.Dev {
		return fmt.Errorf("process %d has not entered the node's namespace yet", pid)
	}
	_, port, _ := net.SplitHostPort(addr)
	p, _ := strconv.Atoi(port)
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/tcp", pid))
	if err != nil {
		return err
	}
	want := fmt.Sprintf(":%04X", p)
	for _, line := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) > 3 && strings.HasSuffix(f[1], want) && f[3] == "0A" { // 0A: LISTEN
			return nil
		}
	}
	return fmt.Errorf("nothing listens on %s", addr)
}

// mustEval resolves symlinks, as /proc/<pid>/exe shows a program.
func mustEval(t *testing.T, p string) string {
	t.Helper()
	r, err := filepath.EvalSymlinks(p)
	if err != nil {
		t.Fatal(err)
	}
	return r
}
