package main

// `netbench recycle` measures what it costs to hand a released slot to its
// next owner, side by side in one run:
//
//   - reset in place: undo a tenant's changes inside the same namespace.
//     What is measured is a lower bound of a complete reset: links,
//     addresses of both families, routes of every table, rules,
//     neighbours, the nftables ruleset, every sysctl under /proc/sys/net
//     (read, compared with a fresh namespace's, written back where they
//     differ), conntrack inside and on the host. It does not find
//     iptables-legacy rules, XFRM state, qdiscs, or processes and
//     descriptors that keep the namespace, which no reset can take back.
//   - recreate: tear the slot down and make a fresh one at the index
//     (what pool.Put does now), timed as two parts.
//   - the pool itself: Get+Put cycles on a warm pool, with Put recreating.
//
//	cd test && sudo go run ./netbench recycle -cycles 200 -out ../docs/benchmarks/recycle.md

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	vns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/network/index"
	"github.com/phasegate/phasegate/network/netns"
	"github.com/phasegate/phasegate/network/pool"
	"github.com/phasegate/phasegate/network/slot"
)

func recycleMain(args []string) int {
	fs := flag.NewFlagSet("netbench recycle", flag.ExitOnError)
	cycles := fs.Int("cycles", 200, "cycles per strategy")
	target := fs.Int("pool-target", 4, "warm slots of the pool in the pool cycle")
	out := fs.String("out", "", "write the Markdown report here (default: stdout only)")
	_ = fs.Parse(args)
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "netbench: needs root")
		return 2
	}
	dir, err := os.MkdirTemp("", "netbench-recycle")
	if err != nil {
		fmt.Fprintln(os.Stderr, "netbench:", err)
		return 1
	}
	cfg := slot.Config{
		Prefix: randomPrefix("pr"), NetnsDir: dir,
		Slots: *target + 64, CIDR: netip.MustParsePrefix("169.254.0.0/17"),
	}
	defer func() {
		if err := sweep(cfg); err != nil {
			fmt.Fprintln(os.Stderr, "netbench: sweep:", err)
		}
		os.Remove(dir)
	}()
	m, err := slot.NewManager(context.Background(), cfg, slot.DefaultOptions())
	if err != nil {
		fmt.Fprintln(os.Stderr, "netbench:", err)
		return 1
	}
	r := &recycleResults{cycles: *cycles, target: *target,
		cmd: fmt.Sprintf("cd test && go run ./netbench recycle -cycles %d -pool-target %d -out ../docs/benchmarks/recycle.md", *cycles, *target)}
	if err := runRecycle(context.Background(), m, r); err != nil {
		fmt.Fprintln(os.Stderr, "netbench:", err)
		return 1
	}
	md := r.markdown()
	fmt.Print(md)
	if *out != "" {
		if err := os.WriteFile(*out, []byte(md), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "netbench:", err)
			return 1
		}
	}
	return 0
}

// cpu is the CPU time spent so far: by this process, and by the whole
// machine (which includes the kernel's namespace clean-up worker, and
// whatever else runs: read it as an upper bound on a shared machine).
type cpu struct{ self, machine time.Duration }

func cpuNow() cpu {
	var ru unix.Rusage
	_ = unix.Getrusage(unix.RUSAGE_SELF, &ru)
	c := cpu{self: time.Duration(ru.Utime.Nano() + ru.Stime.Nano())}
	if b, err := os.ReadFile("/proc/stat"); err == nil {
		f := strings.Fields(strings.SplitN(string(b), "\n", 2)[0])
		var ticks int64
		for k, v := range f[1:] {
			if k == 3 || k == 4 { // idle, iowait
				continue
			}
			n, _ := strconv.ParseInt(v, 10, 64)
			ticks += n
		}
		c.machine = time.Duration(ticks) * 10 * time.Millisecond // USER_HZ = 100
	}
	return c
}

func (a cpu) sub(b cpu) cpu { return cpu{a.self - b.self, a.machine - b.machine} }

type strategy struct {
	name    string
	lat     []time.Duration // per cycle: the reset, the teardown, or pool.Put
	bg      []time.Duration // per cycle: the creation (recreate only)
	wall    time.Duration
	cpu     cpu
	comment string
}

type recycleResults struct {
	cycles, target int
	cmd            string
	kernel, cpus   string
	load           [2]string
	sysctls        int
	strategies     []*strategy
	getP50, getP99 time.Duration
}

// runRecycle measures the three ways to give a released slot back: a
// reset in place (without and with the sysctls), a recreate at the same
// index, and the pool's Get+Put.
func runRecycle(ctx context.Context, m *slot.Manager, r *recycleResults) error {
	var u unix.Utsname
	_ = unix.Uname(&u)
	r.kernel = unix.ByteSliceToString(u.Release[:])
	r.cpus = fmt.Sprintf("%d CPUs, %s", runtime.NumCPU(), runtime.Version())
	r.load[0] = loadavg()
	defer func() { r.load[1] = loadavg() }()

	// Reference: a fresh namespace's sysctls.
	ref, err := m.Create(ctx, 1)
	if err != nil {
		return err
	}
	want, err := readSysctls(ref.NetnsPath)
	if err != nil {
		return err
	}
	r.sysctls = len(want)

	// 1. Reset in place, on slot 1, dirtied lightly before every cycle
	//    (one address, one sysctl): the cheapest case for a reset. Once
	//    without the sysctls (about what Manager.Reset used to do), once
	//    with them.
	resets, err := measureResets(ref, want, r.cycles)
	if err != nil {
		return err
	}
	// 2. Recreate at the same index, slot 2: teardown, then creation.
	rec, err := measureRecreate(ctx, m, r.cycles)
	if err != nil {
		return err
	}
	if res := m.Teardown(ctx, slot.Assume(1, 2), slot.TeardownOptions{}); res.Err() != nil {
		return res.Err()
	}
	// 3. The pool: Get+Put cycles on a warm pool whose Put recreates.
	cyc, err := measurePoolCycles(ctx, m, r)
	if err != nil {
		return err
	}
	r.strategies = append(resets, rec, cyc)
	return nil
}

// measureResets resets ref in place cycles times, dirtied before each,
// once without the sysctls and once putting want back.
func measureResets(ref *slot.Slot, want map[string]string, cycles int) ([]*strategy, error) {
	var resets []*strategy
	for _, sweep := range []bool{false, true} {
		fmt.Fprintln(os.Stderr, "reset in place, sysctls:", sweep)
		st := &strategy{name: "reset in place, without sysctls", comment: "not clean: the tenant's sysctls stay"}
		w := map[string]string(nil)
		if sweep {
			st.name, st.comment, w = "reset in place (lower bound)", "Put waits for all of it; Get is free (the same slot comes back)", want
		}
		c0, t0 := cpuNow(), time.Now()
		var dirtyTime time.Duration
		for k := range cycles {
			d0 := time.Now()
			if err := dirty(ref, k); err != nil {
				return nil, err
			}
			dirtyTime += time.Since(d0)
			t := time.Now()
			if err := resetInPlace(ref, w); err != nil {
				return nil, err
			}
			st.lat = append(st.lat, time.Since(t))
		}
		st.wall, st.cpu = time.Since(t0)-dirtyTime, cpuNow().sub(c0)
		if err := checkClean(ref, want); (err == nil) != sweep {
			return nil, fmt.Errorf("reset (sysctls %v): clean check: %v", sweep, err)
		}
		resets = append(resets, st)
	}
	return resets, nil
}

// measureRecreate tears slot 2 down and creates it again, cycles times.
func measureRecreate(ctx context.Context, m *slot.Manager, cycles int) (*strategy, error) {
	fmt.Fprintln(os.Stderr, "recreate...")
	if _, err := m.Create(ctx, 2); err != nil {
		return nil, err
	}
	rec := &strategy{name: "recreate (teardown + create)"}
	c0, t0 := cpuNow(), time.Now()
	for range cycles {
		t := time.Now()
		res := m.Teardown(ctx, slot.Assume(2), slot.TeardownOptions{})
		if err := res.Err(); err != nil {
			return nil, err
		}
		rec.lat = append(rec.lat, time.Since(t))
		t = time.Now()
		if _, err := m.Create(ctx, 2); err != nil {
			return nil, err
		}
		rec.bg = append(rec.bg, time.Since(t))
	}
	rec.wall, rec.cpu = time.Since(t0), cpuNow().sub(c0)
	rec.comment = "the kernel work of one release; pool.Put waits for both parts"
	return rec, nil
}

// measurePoolCycles makes r.cycles Get+Put cycles on a warm pool of
// r.target whose Put recreates, counting the replacements still being
// made at the end; it closes the pool.
func measurePoolCycles(ctx context.Context, m *slot.Manager, r *recycleResults) (*strategy, error) {
	fmt.Fprintln(os.Stderr, "pool cycles...")
	st, err := index.New(m.Config().Slots, nil)
	if err != nil {
		return nil, err
	}
	p, err := pool.New(m, st, pool.Options{Target: r.target, Grace: time.Hour})
	if err != nil {
		return nil, err
	}
	defer p.Close(context.WithoutCancel(ctx))
	if err := p.WaitReady(ctx, r.target); err != nil {
		return nil, err
	}
	cyc := &strategy{name: fmt.Sprintf("pool Get+Put, target %d", r.target)}
	var gets []time.Duration
	c0, t0 := cpuNow(), time.Now()
	for range r.cycles {
		t := time.Now()
		s, err := p.Get(ctx)
		if err != nil {
			return nil, err
		}
		gets = append(gets, time.Since(t))
		t = time.Now()
		if err := p.Put(ctx, s); err != nil {
			return nil, err
		}
		cyc.lat = append(cyc.lat, time.Since(t))
	}
	// The replacements still being made are part of the cost.
	for sn := p.Snapshot(); sn.Filling > 0 || len(sn.Creating) > 0; sn = p.Snapshot() {
		time.Sleep(time.Millisecond)
	}
	cyc.wall, cyc.cpu = time.Since(t0), cpuNow().sub(c0)
	cyc.comment = fmt.Sprintf("Put = teardown + replacement; Get p50 %s, p99 %s", us(pct(gets, 0.5)), us(pct(gets, 0.99)))
	r.getP50, r.getP99 = pct(gets, 0.5), pct(gets, 0.99)
	return cyc, p.Close(ctx)
}

// dirty does what a light tenant does: one more address, one sysctl.
func dirty(s *slot.Slot, k int) error {
	fd, err := netns.Open(s.NetnsPath)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	h, err := netlink.NewHandleAt(vns.NsHandle(fd))
	if err != nil {
		return err
	}
	defer h.Close()
	eth0, err := h.LinkByName(s.InsideIf)
	if err != nil {
		return err
	}
	a, _ := netlink.ParseAddr(fmt.Sprintf("192.0.2.%d/24", 1+k%250))
	if err := h.AddrAdd(eth0, a); err != nil {
		return err
	}
	return inNetns(s.NetnsPath, func() error {
		return os.WriteFile("/proc/sys/net/ipv4/ip_default_ttl", []byte("7"), 0)
	})
}

// checkClean verifies the light tenant's changes are gone.
func checkClean(s *slot.Slot, want map[string]string) error {
	got, err := readSysctls(s.NetnsPath)
	if err != nil {
		return err
	}
	if got["net/ipv4/ip_default_ttl"] != want["net/ipv4/ip_default_ttl"] {
		return fmt.Errorf("ip_default_ttl = %q", got["net/ipv4/ip_default_ttl"])
	}
	return nil
}

// readSysctls reads every readable file under /proc/sys/net inside the
// namespace at path.
func readSysctls(path string) (map[string]string, error) {
	out := map[string]string{}
	err := inNetns(path, func() error {
		return filepath.WalkDir("/proc/sys/net", func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			if b, err := os.ReadFile(p); err == nil {
				out[strings.TrimPrefix(p, "/proc/sys/")] = string(b)
			}
			return nil
		})
	})
	return out, err
}

// resetInPlace undoes a tenant's changes inside slot s's namespace without
// replacing it (the lower bound described at the top of this file).
// With want nil it skips the sysctls.
func resetInPlace(s *slot.Slot, want map[string]string) error {
	fd, err := netns.Open(s.NetnsPath)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	h, err := netlink.NewHandleAt(vns.NsHandle(fd))
	if err != nil {
		return err
	}
	defer h.Close()
	eth0, errs, err := clearTenantNetwork(h, s)
	if err != nil {
		return err
	}
	c, err := nftables.New(nftables.WithNetNSFd(fd))
	if err != nil {
		return err
	}
	c.FlushRuleset()
	errs = append(errs, c.Flush())
	errs = append(errs, inNetns(s.NetnsPath, func() error { return restoreSysctls(want) }))
	if err := h.ConntrackTableFlush(netlink.ConntrackTable); err != nil && !errors.Is(err, unix.ENOENT) {
		errs = append(errs, err)
	}
	f := &netlink.ConntrackFilter{}
	_ = f.AddIP(netlink.ConntrackOrigSrcIP, s.InsideAddr.Addr().AsSlice())
	_, _ = netlink.ConntrackDeleteFilters(netlink.ConntrackTable, netlink.FAMILY_V4, f)
	// eth0 up with its address and the default route.
	errs = append(errs, h.LinkSetUp(eth0))
	in := &net.IPNet{IP: s.InsideAddr.Addr().AsSlice(), Mask: net.CIDRMask(31, 32)}
	errs = append(errs, h.AddrReplace(eth0, &netlink.Addr{IPNet: in}))
	errs = append(errs, h.RouteReplace(&netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: s.HostAddr.Addr().AsSlice()}))
	return errors.Join(errs...)
}

// clearTenantNetwork removes inside slot s's namespace (h) what a tenant
// may have added: links beside lo and the slot's eth0, addresses but the
// slot's, routes and rules but the kernel's and the slot's, neighbours.
// It returns eth0 and the errors of the removals; err is a listing that
// failed.
func clearTenantNetwork(h *netlink.Handle, s *slot.Slot) (eth0 netlink.Link, errs []error, err error) {
	links, err := h.LinkList()
	if err != nil {
		return nil, nil, err
	}
	for _, l := range links {
		switch l.Attrs().Name {
		case "lo":
		case s.InsideIf:
			eth0 = l
		default:
			errs = append(errs, h.LinkDel(l))
		}
	}
	if eth0 == nil {
		return nil, nil, errors.New("no eth0")
	}
	addrs, err := h.AddrList(eth0, netlink.FAMILY_ALL)
	if err != nil {
		return nil, nil, err
	}
	for _, a := range addrs {
		if a.IP.Equal(s.InsideAddr.Addr().AsSlice()) || (a.IP.To4() == nil && a.IP.IsLinkLocalUnicast()) {
			continue
		}
		errs = append(errs, h.AddrDel(eth0, &a))
	}
	routes, err := h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, nil, err
	}
	for _, rt := range routes {
		if rt.Table == unix.RT_TABLE_LOCAL || (rt.Table == unix.RT_TABLE_MAIN && rt.LinkIndex == eth0.Attrs().Index) {
			continue // the kernel's own and the slot's (re-made below)
		}
		errs = append(errs, h.RouteDel(&rt))
	}
	rules, err := h.RuleList(netlink.FAMILY_ALL)
	if err != nil {
		return nil, nil, err
	}
	for _, ru := range rules {
		if ru.Priority != 0 && ru.Priority != 32766 && ru.Priority != 32767 {
			errs = append(errs, h.RuleDel(&ru))
		}
	}
	neigh, err := h.NeighList(0, netlink.FAMILY_ALL)
	if err != nil {
		return nil, nil, err
	}
	for _, n := range neigh {
		if !n.IP.IsMulticast() {
			_ = h.NeighDel(&n) // an entry may already be gone
		}
	}
	return eth0, errs, nil
}

// restoreSysctls writes back, in the current thread's namespace, every
// sysctl under /proc/sys/net that differs from want (nil: none).
func restoreSysctls(want map[string]string) error {
	if want == nil {
		return nil
	}
	return filepath.WalkDir("/proc/sys/net", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return nil
		}
		if w, ok := want[strings.TrimPrefix(p, "/proc/sys/")]; ok && !bytes.Equal(b, []byte(w)) {
			_ = os.WriteFile(p, []byte(w), 0) // some are read-only
		}
		return nil
	})
}

// inNetns runs fn on an OS thread inside the namespace at path; the thread
// is never handed back to Go.
func inNetns(path string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if unix.Gettid() == unix.Getpid() {
			errc <- inNetns(path, fn) // the main thread never exits
			runtime.UnlockOSThread()
			return
		}
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- err
			return
		}
		err = unix.Setns(fd, unix.CLONE_NEWNET)
		unix.Close(fd)
		if err != nil {
			errc <- err
			return
		}
		errc <- fn()
	}()
	return <-errc
}

func (r *recycleResults) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Handing a released slot to its next owner: reset in place vs recreate\n\n")
	fmt.Fprintf(&b, "`%s`\n\n", r.cmd)
	fmt.Fprintf(&b, "Kernel %s, %s; load average %s at the start, %s at the end. %d cycles per strategy, in one run. A namespace has %d readable sysctls under /proc/sys/net.\n\n",
		r.kernel, r.cpus, r.load[0], r.load[1], r.cycles, r.sysctls)
	fmt.Fprintf(&b, "| strategy | reset / teardown / Put p50 | p99 | create p50 | cycles/s | CPU per cycle: this process | whole machine | note |\n|---|---|---|---|---|---|---|---|\n")
	for _, s := range r.strategies {
		bg := "–"
		if len(s.bg) > 0 {
			bg = ms(pct(s.bg, 0.5))
		}
		n := time.Duration(len(s.lat))
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %.0f | %s | %s | %s |\n", s.name, ms(pct(s.lat, 0.5)), ms(pct(s.lat, 0.99)), bg,
			float64(len(s.lat))/s.wall.Seconds(), ms(s.cpu.self/n), ms(s.cpu.machine/n), s.comment)
	}
	fmt.Fprintf(&b, "\n\"Whole machine\" is the busy time of every CPU from /proc/stat, which includes the kernel's namespace clean-up worker and anything else running on this shared machine; read it as an upper bound. The reset row is a lower bound of a complete reset: it cannot find processes or descriptors that keep the namespace, iptables-legacy rules, XFRM state or qdiscs.\n")
	return b.String()
}
