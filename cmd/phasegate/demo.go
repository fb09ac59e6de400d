package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/app/status"
	"github.com/phasegate/phasegate/network/nft"
	"github.com/phasegate/phasegate/network/slot"
	"github.com/phasegate/phasegate/phases"
	"github.com/phasegate/phasegate/phases/lockfile"
)

// demoPoolSize is the warm pool of the demo's daemon.
const demoPoolSize = 8

// demoCmd shows a newcomer the whole story in one command: it leaks slots
// the way a crashed daemon leaves them, starts a daemon (this binary, as a
// child) that binds its port at once and reclaims them, follows the start
// live, shows the health answers turning from 503 to 200, says where the
// timeline page is, and on exit (Ctrl-C included) stops the daemon and
// removes everything it made: every name it uses starts with its own
// prefix and its namespaces live in a temporary directory.
func demoCmd(ctx context.Context, e env) int {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	leaked := fs.Int("leaked", 2000, "leaked slots to make before the daemon starts")
	prefix := fs.String("prefix", "demo-", "prefix of every name the demo makes (netns, links, nftables table)")
	dir := fs.String("dir", "", "directory for the demo's namespaces, lock and log (default: a new temporary directory, removed on exit)")
	listen := fs.String("listen", "127.0.0.1:0", "the daemon's address (port 0: a free port)")
	hold := fs.Bool("hold", true, "once serving, keep the daemon up until Ctrl-C")
	if code, done := e.parseCommand(fs, "demo [flags]"); done {
		return code
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(e.stderr, "phasegate demo: needs root: it makes network namespaces, veth pairs and an nftables table")
		return exitUsage
	}
	if *leaked < 0 {
		fmt.Fprintln(e.stderr, "phasegate demo: --leaked must not be negative")
		return exitUsage
	}
	d := &demo{e: e, prefix: *prefix}
	if err := d.setup(*dir, *leaked); err != nil {
		fmt.Fprintf(e.stderr, "phasegate demo: %v\n", err)
		return exitUsage
	}
	code := d.run(ctx, *leaked, *listen, *hold)
	if err := d.cleanup(); err != nil {
		fmt.Fprintf(e.stderr, "phasegate demo: clean-up: %v\n", err)
		return exitFailed
	}
	return code
}

type demo struct {
	e       env
	prefix  string
	dir     string // removed at the end when the demo made it
	ownDir  bool
	cfg     slot.Config
	lock    *lockfile.Lock
	logPath string
	child   *exec.Cmd
	exited  chan struct{} // closed when the child exited
}

// lockPath is the demo's own lock, beside the daemons' in the lock
// directory only root controls (in /tmp anyone could take it first).
func (d *demo) lockPath() string {
	return filepath.Join(lockfile.DefaultDir, "demo-"+d.prefix+".lock")
}

func (d *demo) say(format string, a ...any) { fmt.Fprintf(d.e.stdout, format+"\n", a...) }

func (d *demo) setup(dir string, leaked int) error {
	var err error
	if dir == "" {
		if dir, err = os.MkdirTemp("", "phasegate-demo-"); err != nil {
			return err
		}
		d.ownDir = true
	} else if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	d.dir = dir
	d.logPath = filepath.Join(dir, "daemon.log")
	d.cfg = slot.Config{
		Prefix:   d.prefix,
		NetnsDir: filepath.Join(dir, "netns"),
		Slots:    leaked + demoPoolSize + 64,
		CIDR:     slot.DefaultCIDR,
	}
	if err := d.cfg.Validate(); err != nil {
		d.removeDir()
		return fmt.Errorf("%s", oneLine(err))
	}
	// One demo per prefix at a time: the lock makes the sweep of an earlier,
	// killed demo's leftovers safe.
	d.lock, err = lockfile.Acquire(context.Background(), d.lockPath(), 0)
	if err != nil {
		d.removeDir()
		return fmt.Errorf("another demo with prefix %q runs: %w", d.prefix, err)
	}
	if n, err := d.sweep(); err != nil {
		return fmt.Errorf("sweeping an earlier demo's leftovers: %w", err)
	} else if n > 0 {
		d.say("removed %d leftovers of an earlier demo with prefix %q", n, d.prefix)
	}
	return nil
}

// run makes the leaks, starts the daemon, follows it and waits; it returns
// the exit code. Cleanup is the caller's.
func (d *demo) run(ctx context.Context, leaked int, listen string, hold bool) int {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var interrupted atomic.Bool
	var wg sync.WaitGroup
	defer wg.Wait()
	stopSignals := make(chan struct{})
	defer close(stopSignals)
	wg.Go(func() { d.cancelOnSignal(cancel, &interrupted, stopSignals) })

	d.say("phasegate demo: a node daemon restarting on a host that a crashed run left dirty.")
	if err := d.leakStep(ctx, leaked); err != nil {
		if interrupted.Load() {
			return exitOK
		}
		fmt.Fprintf(d.e.stderr, "phasegate demo: leaking slots: %v\n", err)
		return exitFailed
	}

	addr, err := pickAddr(listen)
	if err != nil {
		fmt.Fprintf(d.e.stderr, "phasegate demo: --listen %s: %v\n", listen, err)
		return exitUsage
	}
	if err := d.startStep(addr, leaked); err != nil {
		fmt.Fprintf(d.e.stderr, "phasegate demo: %v\n", err)
		return exitFailed
	}
	answers := d.watchHealth(ctx, &wg, addr)
	d.say("")
	d.e.args = nil
	client := &http.Client{Timeout: 2 * time.Second}
	code := status.Follow(ctx, client, "http://"+addr+"/debug/lifecycle",
		status.Watch{Out: d.e.stdout, Err: d.e.stderr, Name: "phasegate status", Terminal: d.e.isTTY, Every: 150 * time.Millisecond})
	if interrupted.Load() {
		return exitOK
	}
	d.healthStep(answers())
	if code != exitOK {
		fmt.Fprintf(d.e.stderr, "phasegate demo: the daemon did not reach serving; see %s\n", d.logPath)
		return exitFailed
	}
	d.servingStep(addr)
	if !hold {
		return exitOK
	}
	return d.holdUntilStopped(ctx)
}

// cancelOnSignal cancels the demo at the first signal, noting that it was
// interrupted, unless stop is closed first.
func (d *demo) cancelOnSignal(cancel context.CancelFunc, interrupted *atomic.Bool, stop <-chan struct{}) {
	select {
	case sig := <-d.e.signals:
		interrupted.Store(true)
		fmt.Fprintf(d.e.stdout, "\n%s: stopping and cleaning up…\n", sig)
		cancel()
	case <-stop:
	}
}

// leakStep is step 1: it leaks the slots, saying so.
func (d *demo) leakStep(ctx context.Context, leaked int) error {
	d.say("")
	d.say("1. Leaking %d slots the way a killed daemon leaves them: a network namespace in %s,", leaked, d.cfg.NetnsDir)
	d.say("   a veth pair and an nftables set element each, all named %s*.", d.prefix)
	start := time.Now()
	if err := d.leak(ctx, leaked); err != nil {
		return err
	}
	d.say("   done in %s.", time.Since(start).Round(time.Millisecond))
	return nil
}

// startStep is step 2: it starts the daemon on addr, saying so.
func (d *demo) startStep(addr string, leaked int) error {
	d.say("")
	d.say("2. Starting `phasegate serve` on %s: it binds the port within milliseconds and", addr)
	d.say("   answers health checks with 503 and its progress while it reclaims; log: %s", d.logPath)
	return d.startDaemon(addr, leaked)
}

// healthStep is step 3: it shows the health answers seen during the start.
func (d *demo) healthStep(answers []string) {
	d.say("")
	d.say("3. What a health checker (Nomad, Consul, Kubernetes) saw at GET /health meanwhile")
	d.say("   (200 warn: serving, with something to look at, such as dead slots still being reclaimed):")
	for _, a := range answers {
		d.say("   %s", a)
	}
}

// servingStep is step 4: it says where to look at the serving daemon.
func (d *demo) servingStep(addr string) {
	d.say("")
	d.say("4. The daemon serves. Look around, in another terminal:")
	d.say("   the start as a timeline:   http://%s/debug/startup   (a browser; ssh -L %s:%s for a remote host)", addr, portOf(addr), addr)
	d.say("   health:                    curl -s http://%s/health", addr)
	d.say("   metrics:                   curl -s http://%s/metrics | grep ^phasegate_", addr)
	self := invokedAs()
	d.say("   phases:                    %s status --watch --addr %s", self, addr)
	sock := filepath.Join(d.dir, "state", phases.ControlSocketName)
	d.say("   a slot:                    %s slots acquire me --socket %s", self, sock)
	d.say("   the slots:                 %s slots list --socket %s", self, sock)
}

// holdUntilStopped keeps the daemon up until ctx ends (Ctrl-C), or fails
// when the daemon exits first.
func (d *demo) holdUntilStopped(ctx context.Context) int {
	d.say("")
	d.say("Press Ctrl-C to stop the daemon and remove everything the demo made.")
	select {
	case <-ctx.Done():
		return exitOK
	case <-d.exited:
		fmt.Fprintf(d.e.stderr, "phasegate demo: the daemon exited; see %s\n", d.logPath)
		return exitFailed
	}
}

// leak makes slots 1..n with the slot manager and forgets them.
func (d *demo) leak(ctx context.Context, n int) error {
	m, err := slot.NewManager(ctx, d.cfg, slot.Options{})
	if err != nil {
		return err
	}
	ch := make(chan int)
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
		done atomic.Int64
	)
	for range 4 {
		wg.Go(func() {
			for i := range ch {
				if _, err := m.Create(ctx, i); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
				done.Add(1)
			}
		})
	}
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
feed:
	for i := 1; i <= n; i++ {
		select {
		case ch <- i:
		case <-ctx.Done():
			break feed
		case <-tick.C:
			if d.e.isTTY {
				fmt.Fprintf(d.e.stdout, "\r   %d/%d", done.Load(), n)
			} else {
				d.say("   %d/%d", done.Load(), n)
			}
			i--
		}
	}
	close(ch)
	wg.Wait()
	if d.e.isTTY {
		fmt.Fprint(d.e.stdout, "\r\x1b[2K")
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return errors.Join(errs...)
}

// pickAddr resolves port 0 to a free port, so the address can be shown
// before the daemon binds it.
func pickAddr(listen string) (string, error) {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return "", err
	}
	if port != "0" {
		return listen, nil
	}
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// invokedAs is how the operator ran this binary, for commands to copy:
// "bin/phasegate" after `make demo`, "phasegate" when it is on PATH.
func invokedAs() string {
	if len(os.Args) > 0 && strings.Contains(os.Args[0], "/") && !filepath.IsAbs(os.Args[0]) {
		return os.Args[0]
	}
	return "phasegate"
}

func portOf(addr string) string {
	_, p, _ := net.SplitHostPort(addr)
	return p
}

// startDaemon runs this binary's serve as a child in its own process group,
// so that a Ctrl-C reaches the demo, which then stops the daemon in order.
func (d *demo) startDaemon(addr string, leaked int) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	logf, err := os.Create(d.logPath)
	if err != nil {
		return err
	}
	cmd := exec.Command(self, "serve",
		"--listen="+addr,
		"--state-dir="+filepath.Join(d.dir, "state"),
		"--netns-dir="+d.cfg.NetnsDir,
		"--slot-prefix="+d.prefix,
		"--slots="+strconv.Itoa(d.cfg.Slots),
		"--slot-cidr="+d.cfg.CIDR.String(),
		"--pool-size="+strconv.Itoa(demoPoolSize),
		"--drain-delay=500ms",
		"--stop-timeout=5s",
	)
	// The demo's own listen address is loopback; the rest of the
	// environment (OTEL_*, for instance) is passed on.
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start the daemon: %w", err)
	}
	d.child = cmd
	d.exited = make(chan struct{})
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(d.exited)
	}()
	return nil
}

// watchHealth polls /health until ctx ends or the daemon serves, and
// returns a function listing the answers that differed from the one before.
func (d *demo) watchHealth(ctx context.Context, wg *sync.WaitGroup, addr string) func() []string {
	var (
		mu      sync.Mutex
		answers []string
		last    string
		lastAt  time.Time
	)
	done := make(chan struct{})
	began := time.Now()
	client := &http.Client{Timeout: time.Second}
	wg.Go(func() {
		defer close(done)
		for ctx.Err() == nil {
			code, output, err := getHealth(ctx, client, "http://"+addr+"/health")
			// A line when the code changes, or what it says, at most
			// every half second.
			if err == nil && output != last && (code != http.StatusServiceUnavailable || time.Since(lastAt) >= 500*time.Millisecond || len(answers) == 0) {
				line := fmt.Sprintf("+%-7s %d %s", time.Since(began).Round(10*time.Millisecond), code, output)
				mu.Lock()
				answers = append(answers, line)
				mu.Unlock()
				last, lastAt = output, time.Now()
			}
			if code == http.StatusOK {
				return
			}
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	})
	return func() []string {
		select {
		case <-done:
		case <-time.After(3 * time.Second):
		}
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), answers...)
	}
}

func getHealth(ctx context.Context, c *http.Client, url string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	var body struct {
		Status string `json:"status"`
		Output string `json:"output"`
		State  string `json:"state"`
	}
	_ = json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&body)
	out := body.Status
	if body.Output != "" {
		out += ": " + body.Output
	} else if body.State != "" {
		out += " (" + body.State + ")"
	}
	return resp.StatusCode, out, nil
}

// cleanup stops the daemon (SIGTERM, then SIGKILL after 30s) and removes
// everything with the demo's prefix, then its directory.
func (d *demo) cleanup() error {
	if d.child != nil {
		_ = d.child.Process.Signal(syscall.SIGTERM)
		select {
		case <-d.exited:
		case <-time.After(30 * time.Second):
			_ = d.child.Process.Kill()
			<-d.exited
		}
	}
	// A stopped daemon keeps its warm slots (and leased ones) for its next
	// start; the demo is over, so it decommissions them as an operator
	// would, and only then sweeps, counting what was really left over.
	var err error
	if d.child != nil {
		cfg := phases.DefaultConfig()
		cfg.StateDir, cfg.Slots = filepath.Join(d.dir, "state"), d.cfg
		if _, derr := phases.Decommission(context.Background(), cfg, true, nil); derr != nil {
			err = fmt.Errorf("decommission: %w", derr)
		}
	}
	n, serr := d.sweep()
	err = errors.Join(err, serr)
	if err == nil {
		// Check, rather than trust, that nothing is left.
		if left, lerr := d.leftovers(); lerr != nil {
			err = lerr
		} else if len(left) > 0 {
			err = fmt.Errorf("still present after the sweep: %s", strings.Join(left, ", "))
		}
	}
	if d.lock != nil {
		_ = d.lock.Unlock()
		_ = os.Remove(d.lockPath())
	}
	if err != nil {
		return err
	}
	if d.ownDir {
		d.removeDir()
	}
	what := "nothing left behind"
	if n > 0 {
		what = fmt.Sprintf("%d leftovers removed; nothing left behind", n)
	}
	d.say("cleaned up: the daemon stopped, %s (prefix %s).", what, d.prefix)
	return nil
}

func (d *demo) removeDir() {
	if d.ownDir && d.dir != "" {
		for unix.Unmount(d.cfg.NetnsDir, unix.MNT_DETACH) == nil {
		}
		_ = os.RemoveAll(d.dir)
	}
}

// sweep removes every netns file with the prefix in the demo's directory
// (and the directory's own bind mounts), every host link <prefix>h*, and
// the prefix's nftables table; it returns how many it removed.
func (d *demo) sweep() (int, error) {
	var errs []error
	n := 0
	ents, err := os.ReadDir(d.cfg.NetnsDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), d.prefix) {
			continue
		}
		p := filepath.Join(d.cfg.NetnsDir, e.Name())
		for unix.Unmount(p, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW) == nil {
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
		n++
	}
	links, err := netlink.LinkList()
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		errs = append(errs, err)
	}
	for _, l := range links {
		if _, ok := d.cfg.ParseHostIfName(l.Attrs().Name); ok {
			if err := netlink.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
				errs = append(errs, fmt.Errorf("delete link %s: %w", l.Attrs().Name, err))
			}
			n++
		}
	}
	tbl, err := nft.New(d.cfg.TableName())
	if err != nil {
		errs = append(errs, err)
	} else if ok, err := tbl.Exists(context.Background()); err != nil {
		errs = append(errs, err)
	} else if ok {
		if err := tbl.Delete(context.Background()); err != nil {
			errs = append(errs, err)
		}
		n++
	}
	return n, errors.Join(errs...)
}

// leftovers lists what the demo's prefix still names on the host.
func (d *demo) leftovers() ([]string, error) {
	var left []string
	ents, _ := os.ReadDir(d.cfg.NetnsDir)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), d.prefix) {
			left = append(left, "netns "+e.Name())
		}
	}
	links, err := netlink.LinkList()
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return nil, err
	}
	for _, l := range links {
		if _, ok := d.cfg.ParseHostIfName(l.Attrs().Name); ok {
			left = append(left, "link "+l.Attrs().Name)
		}
	}
	if tbl, err := nft.New(d.cfg.TableName()); err == nil {
		if ok, _ := tbl.Exists(context.Background()); ok {
			left = append(left, "nftables table "+d.cfg.TableName())
		}
	}
	return left, nil
}
