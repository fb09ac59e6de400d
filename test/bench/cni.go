package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/network/netns"
)

// The CNI part: phasegate's plugin against the reference bridge +
// host-local plugins, both exec'd as a runtime execs them, in one run.
const (
	pluginPhasegate = "phasegate"
	pluginReference = "reference"
	// refSubnet is the reference network's: outside the default -cidr and
	// -guest-addr, link-local like them.
	refSubnet = "169.254.192.0/20"
	// refPluginDir holds Debian's reference plugins.
	refPluginDir = "/usr/lib/cni"
)

// cniCallers are the concurrencies of ADD and DEL.
var cniCallers = []int{1, 16}

// CNIResult is the CNI part's figures.
type CNIResult struct {
	Calls int `json:"callsPerRun"`
	Reps  int `json:"reps"`
	// Calls is ADD then DEL of Calls attachments, by plugin and callers.
	Sides []CNISide `json:"sides"`
	// ExecMs is the exec of each plugin's VERSION, p50 by rep: what a
	// call costs before it does anything.
	ExecMs map[string][]float64 `json:"execMs"`
	// ExecAllMs is every exec of VERSION, by plugin: its p99 is the
	// floor of any call's p99, which the goal is set against.
	ExecAllMs map[string][]float64 `json:"execAllMs,omitempty"`
	// Podman is `podman run` to a network-ready container, every run's ms,
	// by plugin.
	Podman map[string][]float64 `json:"podmanMs,omitempty"`
	// GC is one GC of GCN attachments a runtime forgot, and the kernel
	// floor's removal of the same objects, ms by rep.
	GCN     int       `json:"gcN"`
	GCMs    []float64 `json:"gcMs"`
	FloorMs []float64 `json:"gcFloorMs"`
}

// CNISide is ADD and DEL latency of one plugin from one number of callers.
type CNISide struct {
	Plugin  string       `json:"plugin"`
	Callers int          `json:"callers"`
	Add     LatencyStats `json:"add"`
	Del     LatencyStats `json:"del"`
}

// cniBench is what the part's runs share: the plugins, their
// configurations and the containers' namespaces.
type cniBench struct {
	r       *runner
	dir     string
	plugin  string // phasegate's, built
	ctrDir  string
	ctrs    []string // the containers' namespaces
	ipamDir string
	bridge  string
	// node is the namespace both plugins (and podman) run in, as a
	// runtime's host namespace: the reference bridge plugin turns on IPv4
	// forwarding where it runs, which must not be the machine's own.
	node string
}

// measureCNI runs the CNI part.
func (r *runner) measureCNI(ctx context.Context) error {
	b, err := r.newCNIBench(ctx, max(r.o.cniCalls, r.o.cniGC))
	if err != nil {
		return err
	}
	defer b.close()
	res := &CNIResult{Calls: r.o.cniCalls, Reps: r.o.reps, ExecMs: map[string][]float64{}, ExecAllMs: map[string][]float64{}, Podman: map[string][]float64{}, GCN: r.o.cniGC}
	lat := map[string][2][]sample{}
	for rep := range r.o.reps {
		r.sampleLoad()
		if err := b.callsRep(ctx, rep, res, lat); err != nil {
			return err
		}
		if err := b.podmanRep(ctx, rep, res); err != nil {
			return fmt.Errorf("podman: %w", err)
		}
		if err := b.gcRep(ctx, rep, res); err != nil {
			return fmt.Errorf("gc: %w", err)
		}
	}
	for _, p := range []string{pluginPhasegate, pluginReference} {
		for _, c := range cniCallers {
			s := lat[sideKey(p, c)]
			res.Sides = append(res.Sides, CNISide{Plugin: p, Callers: c, Add: latencyOf(s[0]), Del: latencyOf(s[1])})
		}
	}
	r.res.CNI = res
	return nil
}

func sideKey(plugin string, callers int) string { return plugin + "/" + strconv.Itoa(callers) }

// newCNIBench builds the plugin and makes n containers' namespaces.
func (r *runner) newCNIBench(ctx context.Context, n int) (*cniBench, error) {
	b := &cniBench{r: r, dir: filepath.Join(r.h.base, "cni"), bridge: r.h.cfg.Prefix + "br"}
	b.ctrDir, b.ipamDir = filepath.Join(b.dir, "ctr"), filepath.Join(b.dir, "ipam")
	var err error
	if b.plugin, err = build(ctx, b.dir, "phasegate-cni", "github.com/phasegate/phasegate/cmd/phasegate-cni"); err != nil {
		return nil, err
	}
	if b.node, err = netns.Create(ctx, b.ctrDir, "node"); err != nil {
		b.close()
		return nil, err
	}
	for i := range n {
		p, err := netns.Create(ctx, b.ctrDir, "c"+strconv.Itoa(i))
		if err != nil {
			b.close()
			return nil, err
		}
		b.ctrs = append(b.ctrs, p)
	}
	return b, nil
}

// close removes the containers' namespaces and the reference bridge.
func (b *cniBench) close() {
	for i := range b.ctrs {
		_ = netns.Delete(context.Background(), b.ctrDir, "c"+strconv.Itoa(i))
	}
	if b.node != "" {
		_ = netns.Delete(context.Background(), b.ctrDir, "node")
	}
	for unix.Unmount(b.ctrDir, unix.MNT_DETACH) == nil {
	}
}

// conf is a plugin's configuration on stdin, for the daemon on socket
// (phasegate's) or for the reference network: spec 1.0.0, the newest
// Debian's reference plugins speak.
func (b *cniBench) conf(plugin, socket string) []byte {
	var c map[string]any
	switch plugin {
	case pluginPhasegate:
		c = map[string]any{"cniVersion": "1.0.0", "name": b.r.h.cfg.Prefix + "cni", "type": "phasegate-cni", "socket": socket, "timeout": "60s"}
	default:
		c = map[string]any{"cniVersion": "1.0.0", "name": b.r.h.cfg.Prefix + "ref", "type": "bridge", "bridge": b.bridge, "isGateway": true, "ipMasq": false,
			"ipam": map[string]any{"type": "host-local", "ranges": [][]map[string]string{{{"subnet": refSubnet}}}, "dataDir": b.ipamDir}}
	}
	out, _ := json.Marshal(c)
	return out
}

// exec runs one verb of a plugin for container i, as a runtime does, and
// returns how long it took from exec to exit.
func (b *cniBench) exec(ctx context.Context, plugin, verb string, conf []byte, i int) (time.Duration, error) {
	bin, path := b.plugin, filepath.Dir(b.plugin)
	if plugin == pluginReference {
		bin, path = filepath.Join(refPluginDir, "bridge"), refPluginDir
	}
	cmd := exec.CommandContext(ctx, bin)
	cmd.Env = []string{"CNI_COMMAND=" + verb, "CNI_PATH=" + path}
	if i >= 0 {
		cmd.Env = append(cmd.Env, "CNI_CONTAINERID=bench"+strconv.Itoa(i), "CNI_IFNAME=eth0", "CNI_NETNS="+b.ctrs[i])
	}
	cmd.Stdin = bytes.NewReader(conf)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	took, err := runIn(b.node, cmd)
	if err != nil {
		return took, fmt.Errorf("%s %s of container %d: %w: %s", plugin, verb, i, err, strings.Join(strings.Fields(out.String()), " "))
	}
	return took, nil
}

// calls runs verb for containers 0..n-1 from callers workers.
func (b *cniBench) calls(ctx context.Context, plugin, verb string, conf []byte, n, callers int) []sample {
	out := make([]sample, n)
	next := make(chan int)
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			for i := range next {
				took, err := b.exec(ctx, plugin, verb, conf, i)
				out[i] = sample{Kind: verb, Latency: int64(took)}
				if err != nil {
					out[i].Err = oneLine(err)
				}
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	return out
}

// callsRep is one rep of ADD and DEL: a fresh daemon whose warm pool holds
// every ADD, then each plugin from each number of callers, the order of
// the plugins turning from rep to rep; and each plugin's exec cost.
func (b *cniBench) callsRep(ctx context.Context, rep int, res *CNIResult, lat map[string][2][]sample) error {
	r, n := b.r, res.Calls
	d, err := b.startDaemon(ctx, n)
	if err != nil {
		return err
	}
	defer d.kill()
	plugins := []string{pluginPhasegate, pluginReference}
	if rep%2 == 1 {
		slices.Reverse(plugins)
	}
	for _, p := range plugins {
		conf := b.conf(p, d.control)
		for _, c := range cniCallers {
			adds := b.calls(ctx, p, "ADD", conf, n, c)
			dels := b.calls(ctx, p, "DEL", conf, n, c)
			k := sideKey(p, c)
			lat[k] = [2][]sample{append(lat[k][0], adds...), append(lat[k][1], dels...)}
			a, dl := latencyOf(adds), latencyOf(dels)
			r.logf("cni rep %d %s, %d callers: ADD p50 %s p99 %s, DEL p50 %s p99 %s, %d errors %s", rep+1, p, c,
				fmtMs(a.P50Ms), fmtMs(a.P99Ms), fmtMs(dl.P50Ms), fmtMs(dl.P99Ms), a.Errors+dl.Errors, a.FirstError+dl.FirstError)
			if p == pluginPhasegate {
				// The next run starts from a full pool, as this one did.
				if _, err := d.waitPoolFilled(ctx, time.Minute); err != nil {
					return err
				}
			}
		}
		var execs []float64
		for range 50 {
			took, err := b.exec(ctx, p, "VERSION", conf, -1)
			if err != nil {
				return err
			}
			execs = append(execs, ms(took))
		}
		slices.Sort(execs)
		res.ExecMs[p] = append(res.ExecMs[p], percentile(execs, 0.5))
		res.ExecAllMs[p] = append(res.ExecAllMs[p], execs...)
	}
	if _, err := d.stop(); err != nil {
		return err
	}
	return r.reset(ctx)
}

// startDaemon starts a daemon with a warm pool of pool slots and waits
// until it is full.
func (b *cniBench) startDaemon(ctx context.Context, pool int) (*daemon, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	d, _, _, err := b.r.startServing(ctx, daemonArgs(b.r.h, addr, b.r.o, modeBackground, pool), nil, startTimeout(0, modeBackground))
	if err != nil {
		return nil, err
	}
	if _, err := d.waitPoolFilled(ctx, 5*time.Minute); err != nil {
		d.kill()
		return nil, err
	}
	return d, nil
}

// gcRep measures one GC of GCN attachments whose runtime forgot them (the
// containers still run: GC deletes their ends), and the kernel floor of
// the same removal (floorRun). The order turns from rep to rep.
func (b *cniBench) gcRep(ctx context.Context, rep int, res *CNIResult) error {
	gc := func() error {
		took, err := b.gcRun(ctx)
		res.GCMs = append(res.GCMs, took)
		return err
	}
	floor := func() error {
		took, err := b.floorRun(ctx)
		res.FloorMs = append(res.FloorMs, took)
		return err
	}
	sides := []func() error{gc, floor}
	if rep%2 == 1 {
		slices.Reverse(sides)
	}
	for _, side := range sides {
		if err := side(); err != nil {
			return err
		}
	}
	return nil
}

// attachAll starts a daemon with a pool of n and attaches n containers
// (not timed).
func (b *cniBench) attachAll(ctx context.Context, n int) (*daemon, []byte, error) {
	d, err := b.startDaemon(ctx, n)
	if err != nil {
		return nil, nil, err
	}
	conf := b.conf(pluginPhasegate, d.control)
	if st := latencyOf(b.calls(ctx, pluginPhasegate, "ADD", conf, n, 16)); st.Errors > 0 {
		d.kill()
		return nil, nil, fmt.Errorf("%d of %d ADDs failed: %s", st.Errors, n, st.FirstError)
	}
	return d, conf, nil
}

// gcRun is one GC of every attachment, nothing valid.
func (b *cniBench) gcRun(ctx context.Context) (float64, error) {
	n := b.r.o.cniGC
	d, conf, err := b.attachAll(ctx, n)
	if err != nil {
		return 0, err
	}
	defer d.kill()
	var c map[string]any
	_ = json.Unmarshal(conf, &c)
	c["cniVersion"], c["cni.dev/valid-attachments"] = "1.1.0", []any{} // GC is spec 1.1's
	gc, _ := json.Marshal(c)
	took, err := b.exec(ctx, pluginPhasegate, "GC", gc, -1)
	if err != nil {
		return 0, err
	}
	b.r.logf("cni GC of %d attachments: %s", n, fmtMs(ms(took)))
	if _, err := d.stop(); err != nil {
		return 0, err
	}
	return ms(took), b.r.reset(ctx)
}

// floorRun is the kernel floor of what gcRun removes: the host ends
// deleted by index from the reclaim's workers (concurrent deletions share
// the kernel's grace periods; one after the other, each waits for its
// own), the slots' namespace files unlinked, until every host end is gone.
func (b *cniBench) floorRun(ctx context.Context) (float64, error) {
	n := b.r.o.cniGC
	d, _, err := b.attachAll(ctx, n)
	if err != nil {
		return 0, err
	}
	d.kill()
	links, err := b.r.h.hostLinkIndices()
	if err != nil {
		return 0, err
	}
	start := time.Now()
	if err := deleteLinks(links, b.r.o.workers); err != nil {
		return 0, err
	}
	if err := unlinkNetns(b.r.h, b.r.o.workers); err != nil {
		return 0, err
	}
	if err := waitLinksGone(ctx, links, 10*time.Minute); err != nil {
		return 0, err
	}
	took := ms(time.Since(start))
	b.r.logf("cni kernel floor of %d attachments: %s", n, fmtMs(took))
	return took, b.r.reset(ctx)
}

// deleteLinks deletes links by index from workers goroutines; one already
// gone is not an error.
func deleteLinks(links []hostLink, workers int) error {
	next := make(chan hostLink)
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for l := range next {
				if err := netlink.LinkDel(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Index: l.index}}); err != nil && !errors.Is(err, unix.ENODEV) {
					select {
					case errs <- fmt.Errorf("delete %s: %w", l.name, err):
					default:
					}
				}
			}
		})
	}
	for _, l := range links {
		next <- l
	}
	close(next)
	wg.Wait()
	close(errs)
	return <-errs
}

// runIn runs cmd in the network namespace at path, as a runtime in that
// namespace would exec it, and returns how long it took from exec to exit
// (the namespace switch is not counted). The child inherits the namespace
// of the thread that forks it: a goroutine locked to a thread of its own
// switches that thread and exits without unlocking it, so that Go
// discards the thread rather than hand it to other goroutines.
func runIn(path string, cmd *exec.Cmd) (time.Duration, error) {
	type result struct {
		took time.Duration
		err  error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err == nil {
			err = unix.Setns(fd, unix.CLONE_NEWNET)
			unix.Close(fd)
		}
		if err != nil {
			done <- result{err: fmt.Errorf("enter %s: %w", path, err)}
			return
		}
		start := time.Now()
		err = cmd.Run()
		done <- result{time.Since(start), err}
	}()
	r := <-done
	return r.took, r.err
}
