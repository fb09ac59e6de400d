// Command cnicost measures what a CNI ADD and DEL cost on this build
// against a baseline build's, in one run, interleaved call by call: a
// daemon of each build runs side by side (each with its own prefix, slot
// network, control socket and warm pool that holds every ADD), and the
// plugin calls alternate between them, exec'd as a runtime execs them,
// so that both sides see the same machine at the same moments. Callers are
// root, into namespaces root made, and a tenant, nobody, granted attach
// for its network, into namespaces it made in user namespaces of its own,
// as a rootless runtime does (docs/BENCHMARKS.md, "The CNI plugin's
// checks"). Each run starts both daemons afresh and decommissions them
// after; the side that goes first turns from rep to rep. It prints a
// Markdown table.
//
//	cd test && go run ./cnicost -baseline /path/to/old -n 200 -reps 4
//
// -baseline is a directory with the baseline's phasegate and phasegate-cni
// (`go build -trimpath` of cmd/phasegate and cmd/phasegate-cni in its
// tree). It needs root, touches nothing but its own prefixes and temporary
// directories, and removes what it made.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/network/netns"
)

const nobody = 65534

// side is one build and what its daemon is given: its own prefix, slot
// network, directories, socket and containers.
type side struct {
	name, daemon, plugin         string
	prefix, cidr, netnsDir, sock string
	ctrDir                       string
	rootCtrs, tenantCtrs         []string
	pid                          int // the running daemon's
}

// network is the side's CNI network.
func (s *side) network() string { return s.prefix + "net" }

// kind is who calls: root or the tenant.
type kind struct {
	name   string
	cred   *syscall.Credential // nil: root
	tenant bool
}

func (k kind) ctrs(s *side) []string {
	if k.tenant {
		return s.tenantCtrs
	}
	return s.rootCtrs
}

// key names one cell of the table.
type key struct {
	side, kind string
	callers    int
}

type bench struct {
	n      int
	settle time.Duration
	held   []*exec.Cmd // the tenant's namespaces' holders
}

func main() {
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

// run is the benchmark; every path out of it removes what it made.
func run() error {
	baseline := flag.String("baseline", "", "directory with the baseline build's phasegate and phasegate-cni")
	n := flag.Int("n", 200, "ADDs, then DELs, per side and run")
	reps := flag.Int("reps", 4, "repetitions of every run")
	callersList := flag.String("callers", "1,16", "concurrent callers of each run, both sides' calls together")
	cidr := flag.String("cidr", "169.254.128.0/18", "slot networks: its two halves, one a side")
	settle := flag.Duration("settle", 2*time.Second, "pause after each run, so that the kernel's namespace clean-up does not overlap the next")
	flag.Parse()
	if *baseline == "" || os.Geteuid() != 0 {
		return errors.New("cnicost: needs root and -baseline DIR")
	}
	var callers []int
	for _, f := range strings.Split(*callersList, ",") {
		c, err := strconv.Atoi(f)
		if err != nil || c < 1 {
			return fmt.Errorf("-callers: %q", f)
		}
		callers = append(callers, c)
	}
	halves, err := split(*cidr)
	if err != nil {
		return err
	}
	base, err := os.MkdirTemp("", "cnicost-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(base)
	// The tenant reaches the control sockets and the plugins here.
	if err := os.Chmod(base, 0o755); err != nil {
		return err
	}
	sides, err := makeSides(base, *baseline, halves)
	if err != nil {
		return err
	}
	b := &bench{n: *n, settle: *settle}
	err = b.containers(context.Background(), sides)
	defer b.cleanup(sides)
	if err != nil {
		return err
	}
	kinds := []kind{{name: "root"}, {name: "tenant (nobody, its own user namespaces)", cred: &syscall.Credential{Uid: nobody, Gid: nobody}, tenant: true}}
	f := figures{adds: map[key][]time.Duration{}, dels: map[key][]time.Duration{}, pluginCPU: map[key][]time.Duration{}, daemonCPU: map[key][]time.Duration{}}
	for rep := range *reps {
		for _, k := range kinds {
			for _, c := range callers {
				order := slices.Clone(sides)
				if rep%2 == 1 {
					slices.Reverse(order)
				}
				r, err := b.run(order, k, c)
				if err != nil {
					return fmt.Errorf("rep %d, %s, %d callers: %w", rep+1, k.name, c, err)
				}
				f.add(r, sides, rep, k, c)
			}
		}
	}
	f.print(kinds, callers)
	return nil
}

// makeSides lays out the two sides under base, each with its own prefix,
// half of the slot network, namespaces, containers and control socket,
// and builds this build's daemon and plugin; the baseline's are in
// baseline.
func makeSides(base, baseline string, halves [2]netip.Prefix) ([]*side, error) {
	tag := fmt.Sprintf("%c%c%c", 'a'+rand.IntN(26), 'a'+rand.IntN(26), 'a'+rand.IntN(26))
	sides := []*side{
		{name: "this build", daemon: filepath.Join(base, "phasegate"), plugin: filepath.Join(base, "phasegate-cni")},
		{name: "baseline", daemon: filepath.Join(baseline, "phasegate"), plugin: filepath.Join(baseline, "phasegate-cni")},
	}
	for i, s := range sides {
		dir := filepath.Join(base, strconv.Itoa(i))
		if err := os.Mkdir(dir, 0o755); err != nil {
			return nil, err
		}
		s.prefix, s.cidr = fmt.Sprintf("c%d%s-", i, tag), halves[i].String()
		s.netnsDir, s.ctrDir, s.sock = filepath.Join(dir, "netns"), filepath.Join(dir, "ctr"), filepath.Join(dir, "control.sock")
	}
	for pkg, out := range map[string]string{"cmd/phasegate": sides[0].daemon, "cmd/phasegate-cni": sides[0].plugin} {
		if out, err := exec.Command("go", "build", "-trimpath", "-o", out, "github.com/phasegate/phasegate/"+pkg).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("build %s: %v\n%s", pkg, err, out)
		}
	}
	return sides, nil
}

// figures are the runs' samples by side, caller and callers: the ADDs'
// and DELs' latencies, the plugin's CPU per ADD, the daemon's per run.
type figures struct {
	adds, dels, pluginCPU, daemonCPU map[key][]time.Duration
}

// add keeps run r's samples (rep, of kind k with c callers) and logs them.
func (f figures) add(r runResult, sides []*side, rep int, k kind, c int) {
	for _, s := range sides {
		kk := key{s.name, k.name, c}
		f.adds[kk], f.dels[kk] = append(f.adds[kk], r.adds[s]...), append(f.dels[kk], r.dels[s]...)
		f.pluginCPU[kk], f.daemonCPU[kk] = append(f.pluginCPU[kk], r.pluginCPU[s]...), append(f.daemonCPU[kk], r.daemonCPU[s])
		log.Printf("rep %d %s %s %d callers: ADD p50 %.2f ms, DEL p50 %.2f ms; CPU per ADD: plugin p50 %.2f ms, daemon %.2f ms", rep+1, s.name, k.name, c,
			ms(pct(r.adds[s], 0.5)), ms(pct(r.dels[s], 0.5)), ms(pct(r.pluginCPU[s], 0.5)), ms(r.daemonCPU[s]))
	}
}

// print writes the Markdown table: each figure, baseline beside this
// build, with their ratio.
func (f figures) print(kinds []kind, callers []int) {
	fmt.Printf("| caller | callers | ADD p50: baseline | this build | ratio | ADD p99: baseline | this build | ratio | DEL p50: baseline | this build | ratio | CPU per ADD, plugin (p50): baseline | this build | ratio | daemon (median of runs): baseline | this build | ratio |\n")
	fmt.Printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, k := range kinds {
		for _, c := range callers {
			ob, nb := key{"baseline", k.name, c}, key{"this build", k.name, c}
			cell := func(m map[key][]time.Duration, p float64) string {
				return fmt.Sprintf("%.2f ms | %.2f ms | %.3f×", ms(pct(m[ob], p)), ms(pct(m[nb], p)), ms(pct(m[nb], p))/ms(pct(m[ob], p)))
			}
			fmt.Printf("| %s | %d | %s | %s | %s | %s | %s |\n", k.name, c, cell(f.adds, 0.5), cell(f.adds, 0.99), cell(f.dels, 0.5), cell(f.pluginCPU, 0.5), cell(f.daemonCPU, 0.5))
		}
	}
}

// split returns the two halves of cidr.
func split(cidr string) ([2]netip.Prefix, error) {
	p, err := netip.ParsePrefix(cidr)
	if err != nil || !p.Addr().Is4() || p.Bits() > 30 {
		return [2]netip.Prefix{}, fmt.Errorf("-cidr %q: want an IPv4 network of /30 or more", cidr)
	}
	p = p.Masked()
	a := p.Addr().As4()
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
	v += 1 << (32 - p.Bits() - 1)
	second := netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
	return [2]netip.Prefix{netip.PrefixFrom(p.Addr(), p.Bits()+1), netip.PrefixFrom(second, p.Bits()+1)}, nil
}

// containers makes, for each side, n namespaces as root (bound files in a
// directory of the side's) and n as the tenant, each in a user namespace
// of its own held by a process.
func (b *bench) containers(ctx context.Context, sides []*side) error {
	for _, s := range sides {
		for i := range b.n {
			p, err := netns.Create(ctx, s.ctrDir, "c"+strconv.Itoa(i))
			if err != nil {
				return err
			}
			s.rootCtrs = append(s.rootCtrs, p)
			cmd := exec.Command("unshare", "--user", "--map-root-user", "--net", "sleep", "infinity")
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
			if err := cmd.Start(); err != nil {
				return err
			}
			b.held = append(b.held, cmd)
			s.tenantCtrs = append(s.tenantCtrs, "/proc/"+strconv.Itoa(cmd.Process.Pid)+"/ns/net")
		}
	}
	// unshare execs sleep once the namespaces are made.
	for _, c := range b.held {
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Millisecond) {
			if exe, _ := os.Readlink("/proc/" + strconv.Itoa(c.Process.Pid) + "/exe"); filepath.Base(exe) == "sleep" {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("process %d never ran sleep", c.Process.Pid)
			}
		}
	}
	return nil
}

// cleanup ends the tenant's holders and removes root's namespaces.
func (b *bench) cleanup(sides []*side) {
	for _, c := range b.held {
		_ = c.Process.Kill()
		_ = c.Wait()
	}
	for _, s := range sides {
		for i := range s.rootCtrs {
			_ = netns.Delete(context.Background(), s.ctrDir, "c"+strconv.Itoa(i))
		}
		for unix.Unmount(s.ctrDir, unix.MNT_DETACH) == nil {
		}
	}
}

// call is one plugin exec of a run.
type call struct {
	s *side
	i int
}

// run is one run: a daemon of each side with a warm pool of n; n ADDs of
// kind k on each, alternating between the sides in order, from callers
// workers; their DELs alike; both daemons stopped and their slots
// decommissioned. It returns every call's time, exec to exit, by side, and
// the CPU the ADDs took: each plugin's, and the daemon's over the ADDs
// (its pool's refill included, the same on both sides).
func (b *bench) run(order []*side, k kind, callers int) (r runResult, err error) {
	var stops []func() error
	defer func() {
		for _, stop := range stops {
			err = errors.Join(err, stop())
		}
		time.Sleep(b.settle)
	}()
	for _, s := range order {
		stop, err := b.start(s)
		if err != nil {
			return r, err
		}
		stops = append(stops, stop)
	}
	var queue []call
	for i := range b.n {
		for _, s := range order {
			queue = append(queue, call{s, i})
		}
	}
	before := map[*side]time.Duration{}
	for _, s := range order {
		before[s] = cpu(s.pid)
	}
	var aerr, derr error
	r.adds, r.pluginCPU, aerr = b.calls(queue, k, "ADD", callers)
	r.daemonCPU = map[*side]time.Duration{}
	for _, s := range order {
		r.daemonCPU[s] = (cpu(s.pid) - before[s]) / time.Duration(b.n)
	}
	r.dels, _, derr = b.calls(queue, k, "DEL", callers)
	return r, errors.Join(aerr, derr)
}

// runResult is what a run measured, by side.
type runResult struct {
	adds, dels, pluginCPU map[*side][]time.Duration
	daemonCPU             map[*side]time.Duration // per ADD
}

// start starts side s's daemon with a warm pool of n, waits until the
// pool is full, and returns its stop: SIGTERM, then decommission.
func (b *bench) start(s *side) (func() error, error) {
	state, err := os.MkdirTemp("/dev/shm", "cnicost-state-")
	if err != nil {
		return nil, err
	}
	slotArgs := []string{"--state-dir=" + state, "--netns-dir=" + s.netnsDir, "--slot-prefix=" + s.prefix,
		"--slots=" + strconv.Itoa(2*b.n+64), "--slot-cidr=" + s.cidr}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := l.Addr().String()
	l.Close()
	args := append(append([]string{"serve", "--listen=" + addr}, slotArgs...),
		"--pool-size="+strconv.Itoa(b.n), "--pool-min-ready=1", "--drain-delay=20ms", "--stop-timeout=2m", "--start-timeout=0",
		// The tenant holds every ADD of a run at once: no quota in
		// the way (this build's default is a quarter of --slots).
		"--max-leases="+strconv.Itoa(2*b.n+64),
		"--control-socket="+s.sock, "--control-group=nogroup", "--control-rate=0", "--allow-attach=uid:65534=cni/"+s.network(),
		"--log-format=json")
	d := exec.Command(s.daemon, args...)
	out, err := d.StdoutPipe()
	if err != nil {
		return nil, err
	}
	d.Stderr = d.Stdout
	if err := d.Start(); err != nil {
		return nil, err
	}
	s.pid = d.Process.Pid
	filled := make(chan struct{})
	var (
		logMu sync.Mutex
		logs  []string
	)
	go func() {
		sc := bufio.NewScanner(out)
		var once sync.Once
		for sc.Scan() {
			line := sc.Text()
			logMu.Lock()
			logs = append(logs, line)
			logMu.Unlock()
			if strings.Contains(line, `"msg":"background task ended"`) && strings.Contains(line, `"task":"fill"`) {
				once.Do(func() { close(filled) })
			}
		}
	}()
	stop := func() error {
		defer os.RemoveAll(state)
		_ = d.Process.Signal(syscall.SIGTERM)
		werr := d.Wait()
		dec := exec.Command(s.daemon, append([]string{"decommission", "--destroy-leased-slots"}, slotArgs...)...)
		o, derr := dec.CombinedOutput()
		// The daemon bind-mounts its netns directory on itself, as `ip
		// netns` does; decommission leaves the mount.
		for unix.Unmount(s.netnsDir, unix.MNT_DETACH) == nil {
		}
		if derr != nil {
			return fmt.Errorf("%s: decommission: %w\n%s", s.name, derr, o)
		}
		if werr != nil {
			logMu.Lock()
			defer logMu.Unlock()
			return fmt.Errorf("%s: daemon: %w; its last lines:\n%s", s.name, werr, strings.Join(logs[max(0, len(logs)-8):], "\n"))
		}
		return nil
	}
	select {
	case <-filled:
		return stop, nil
	case <-time.After(5 * time.Minute):
		return nil, errors.Join(fmt.Errorf("%s: the pool did not fill in 5 minutes", s.name), stop())
	}
}

// calls execs the plugin for verb on every call of queue, in its order,
// from callers workers, and returns the times by side.
func (b *bench) calls(queue []call, k kind, verb string, callers int) (map[*side][]time.Duration, map[*side][]time.Duration, error) {
	took, used := make([]time.Duration, len(queue)), make([]time.Duration, len(queue))
	errs := make([]error, len(queue))
	next := make(chan int)
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			for j := range next {
				c := queue[j]
				conf, _ := json.Marshal(map[string]any{"cniVersion": "1.0.0", "name": c.s.network(), "type": "phasegate-cni", "socket": c.s.sock, "timeout": "60s"})
				cmd := exec.Command(c.s.plugin)
				cmd.Env = []string{"CNI_COMMAND=" + verb, "CNI_PATH=" + filepath.Dir(c.s.plugin), "CNI_CONTAINERID=bench" + strconv.Itoa(c.i),
					"CNI_IFNAME=eth0", "CNI_NETNS=" + k.ctrs(c.s)[c.i]}
				cmd.SysProcAttr = &syscall.SysProcAttr{Credential: k.cred}
				cmd.Stdin = bytes.NewReader(conf)
				var out bytes.Buffer
				cmd.Stdout, cmd.Stderr = &out, &out
				start := time.Now()
				err := cmd.Run()
				took[j] = time.Since(start)
				if cmd.ProcessState != nil {
					used[j] = cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
				}
				if err != nil {
					errs[j] = fmt.Errorf("%s %s of %s: %w: %s", c.s.name, verb, k.ctrs(c.s)[c.i], err, strings.Join(strings.Fields(out.String()), " "))
				}
			}
		})
	}
	for j := range queue {
		next <- j
	}
	close(next)
	wg.Wait()
	bySide, cpuBySide := map[*side][]time.Duration{}, map[*side][]time.Duration{}
	for j, c := range queue {
		bySide[c.s] = append(bySide[c.s], took[j])
		cpuBySide[c.s] = append(cpuBySide[c.s], used[j])
	}
	return bySide, cpuBySide, errors.Join(errs...)
}

// cpu is the CPU time process pid has used, user and system.
func cpu(pid int) time.Duration {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// After the command's name, in parentheses: utime and stime are the
	// 12th and 13th fields.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / 100 // USER_HZ
}

// pct is the p-th quantile of d.
func pct(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
