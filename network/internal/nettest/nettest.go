// Package nettest gives the network tests a private playground on the real
// kernel.
//
// It gives a unique slot prefix, a temporary netns directory, a random
// link-local CIDR, and a cleanup that sweeps every netns file, mount, host
// link and nftables table with that prefix, even when the test fails.
package nettest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/network/netns"
	"github.com/phasegate/phasegate/network/nft"
	"github.com/phasegate/phasegate/network/slot"
)

// Env is one test's playground.
type Env struct {
	// Config uses the playground's prefix, directory and CIDR.
	Config slot.Config
}

// RequireRoot skips the test unless it runs as root.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces, veth, nftables)")
	}
}

// cidrSpace is where playgrounds take their slot networks: the link-local
// /17 below the metadata address's block, which no real network routes.
var cidrSpace = netip.MustParsePrefix("169.254.0.0/17")

// reserveCIDR returns a block of cidrSpace big enough for n /31s that no other
// playground on this machine holds while t runs. Test packages run as
// separate processes at the same time; two playgrounds with the same block
// put the same inside address behind two host links, and a datagram meant
// for one slot reaches the other (seen in CI: "connection refused" from a
// slot of another package). A random pick among a few blocks is not enough,
// so each block is claimed with a lock file held until the test ends.
func reserveCIDR(t testing.TB, n int) netip.Prefix {
	t.Helper()
	// The room n slots need, and a /24 at least: tests that
	// survey names beyond the configured slots raise Config.Slots after
	// New. 128 blocks of the /24 size, many more than test packages run at
	// once.
	bits := 24
	for bits > cidrSpace.Bits() && 1<<(32-bits) < 2*n {
		bits--
	}
	if 1<<(32-bits) < 2*n {
		t.Fatalf("nettest: %d slots do not fit in %s", n, cidrSpace)
	}
	dir := filepath.Join(os.TempDir(), "phasegate-nettest-cidr")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("nettest: %v", err)
	}
	blocks := 1 << (bits - cidrSpace.Bits())
	base := cidrSpace.Addr().As4()
	start := rand.IntN(blocks)
	for i := range blocks {
		off := uint32((start+i)%blocks) << (32 - bits)
		a := netip.AddrFrom4([4]byte{base[0], base[1], base[2] + byte(off>>8), base[3] + byte(off)})
		p := netip.PrefixFrom(a, bits)
		// One lock file per /24 the block covers, so blocks of different
		// sizes that overlap cannot both be held.
		var held []*os.File
		ok := true
		for sub := range 1 << (24 - bits) {
			so := off + uint32(sub)<<8
			name := filepath.Join(dir, fmt.Sprintf("169.254.%d.%d", base[2]+byte(so>>8), byte(so)))
			f, err := os.OpenFile(name, os.O_CREATE|os.O_RDWR, 0o644)
			if err != nil {
				t.Fatalf("nettest: %v", err)
			}
			if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
				f.Close()
				ok = false
				break
			}
			held = append(held, f)
		}
		if ok && hostUses(t, p) {
			ok = false // a daemon's slots, or what a killed run left
		}
		if !ok {
			for _, f := range held {
				f.Close()
			}
			continue
		}
		// Registered before the sweep's cleanup, so it runs after it: the
		// block is free only when nothing of this playground is left.
		t.Cleanup(func() {
			for _, f := range held {
				f.Close()
			}
		})
		return p
	}
	t.Fatalf("nettest: every /%d of %s is held by another playground", bits, cidrSpace)
	return netip.Prefix{}
}

// hostUses reports whether an address or a route of the host falls in p.
// Slots that are not a playground's (a daemon's, a benchmark's, a killed
// run's) hold no lock file, and their addresses take a datagram meant for
// the playground's slot of the same address.
func hostUses(t testing.TB, p netip.Prefix) bool {
	t.Helper()
	// A dump is interrupted whenever links change elsewhere, as they do
	// while other test packages run: try again, and take what an
	// interrupted dump gave at last. What is looked for here (slots no
	// playground holds) does not change meanwhile; what does is other
	// playgrounds', which their lock files keep apart.
	var addrs []netlink.Addr
	var err error
	for range 5 {
		if addrs, err = netlink.AddrList(nil, netlink.FAMILY_V4); !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		t.Fatalf("nettest: list host addresses: %v", err)
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP.To4()); ok && p.Contains(ip) {
			return true
		}
	}
	var routes []netlink.Route
	for range 5 {
		routes, err = netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		t.Fatalf("nettest: list host routes: %v", err)
	}
	for _, r := range routes {
		if r.Dst == nil {
			continue // a default route overlaps everything and takes nothing from a slot
		}
		ip, _ := netip.AddrFromSlice(r.Dst.IP.To4())
		ones, _ := r.Dst.Mask.Size()
		if ones > 0 && netip.PrefixFrom(ip, ones).Overlaps(p) {
			return true
		}
	}
	return false
}

// RandomPrefix returns "pt" and four random lowercase letters.
func RandomPrefix() string {
	b := []byte("pt")
	for range 4 {
		b = append(b, byte('a'+rand.IntN(26)))
	}
	return string(b)
}

// New makes a playground for n slots and registers its sweep with
// t.Cleanup. It skips the test when not root.
func New(t testing.TB, n int) *Env {
	t.Helper()
	RequireRoot(t)
	dir := t.TempDir()
	prefix := RandomPrefix()
	cidr := reserveCIDR(t, n)
	cfg := slot.Config{
		Prefix:   prefix,
		NetnsDir: dir,
		Slots:    n,
		CIDR:     cidr,
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("nettest config: %v", err)
	}
	e := &Env{Config: cfg}
	t.Cleanup(func() {
		if err := Sweep(cfg); err != nil {
			t.Errorf("nettest sweep of %q: %v", prefix, err)
		}
	})
	return e
}

// Sweep removes everything with cfg's prefix: netns files in cfg.NetnsDir
// (and the directory's own bind mount), host links <prefix>h* and ifbs <prefix>b*, and the
// nftables table. It is used by every test's cleanup.
func Sweep(cfg slot.Config) error {
	var errs []error
	ents, err := os.ReadDir(cfg.NetnsDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), cfg.Prefix) {
			continue
		}
		p := filepath.Join(cfg.NetnsDir, e.Name())
		for unix.Unmount(p, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW) == nil {
		}
		if e.Type().IsRegular() {
			if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	if strings.HasPrefix(cfg.NetnsDir, os.TempDir()) {
		// Our temporary directory: drop its self bind mount(s).
		for unix.Unmount(cfg.NetnsDir, unix.MNT_DETACH) == nil {
		}
	}
	links, err := netlink.LinkList()
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		errs = append(errs, err)
	}
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, cfg.HostIfPrefix()) || strings.HasPrefix(l.Attrs().Name, cfg.ShaperIfPrefix()) {
			if err := netlink.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
				errs = append(errs, fmt.Errorf("delete link %s: %w", l.Attrs().Name, err))
			}
		}
	}
	if tbl, err := nft.New(cfg.TableName()); err == nil {
		if err := tbl.Delete(context.Background()); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Manager returns a slot manager for the playground.
func (e *Env) Manager(t testing.TB) *slot.Manager {
	t.Helper()
	m, err := slot.NewManager(context.Background(), e.Config, slot.Options{})
	if err != nil {
		t.Fatalf("NewManager: %v", err)
	}
	return m
}

// Leak makes the given slots with m and forgets them, the way a crashed run
// leaves them, using a few workers.
func Leak(t testing.TB, m *slot.Manager, indices []int) {
	t.Helper()
	ctx := context.Background()
	ch := make(chan int)
	errc := make(chan error, len(indices))
	done := make(chan struct{})
	for range 4 {
		go func() {
			defer func() { done <- struct{}{} }()
			for i := range ch {
				if _, err := m.Create(ctx, i); err != nil {
					errc <- err
				}
			}
		}()
	}
	for _, i := range indices {
		ch <- i
	}
	close(ch)
	for range 4 {
		<-done
	}
	close(errc)
	for err := range errc {
		t.Fatalf("leak: %v", err)
	}
}

// IP runs the ip binary with args in a private mount namespace in which the
// playground's netns directory is bound over /run/netns (iproute2 has no
// option for its directory). Mounts ip makes there propagate back to the
// playground's directory, because it is a shared mount. The host's
// /run/netns is prepared as `ip netns add` would (a shared mount point) and
// made private in the child first, so nothing propagates to it.
func (e *Env) IP(t testing.TB, args ...string) (string, error) {
	t.Helper()
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("ip (iproute2) not installed")
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("unshare (util-linux) not installed")
	}
	if err := netns.PrepareDir("/run/netns"); err != nil {
		t.Fatalf("prepare /run/netns: %v", err)
	}
	if err := netns.PrepareDir(e.Config.NetnsDir); err != nil {
		t.Fatalf("prepare %s: %v", e.Config.NetnsDir, err)
	}
	script := `mount --make-private /run/netns && mount --rbind "$1" /run/netns && shift && exec ip "$@"`
	cmd := exec.Command("unshare", append([]string{"-m", "--propagation", "unchanged", "sh", "-c", script, "sh", e.Config.NetnsDir}, args...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// Start starts a long sleep (or another command) and registers its killing
// with t.Cleanup. Use nsenter or sh in args to place it.
func Start(t testing.TB, name string, args ...string) *exec.Cmd {
	t.Helper()
	if _, err := exec.LookPath(name); err != nil {
		t.Skipf("%s not installed", name)
	}
	cmd := exec.Command(name, args...)
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd
}

// StartInside starts `sleep 600` inside the namespace bound at path and
// waits until it is there.
func StartInside(t testing.TB, path string) *exec.Cmd {
	t.Helper()
	cmd := Start(t, "nsenter", "--net="+path, "sleep", "600")
	want, err := netns.Stat(path)
	if err != nil {
		t.Fatalf("stat %s: %v", path, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var st unix.Stat_t
		if unix.Stat(fmt.Sprintf("/proc/%d/ns/net", cmd.Process.Pid), &st) == nil &&
			st.Dev == want.Dev && st.Ino == want.Ino {
			// nsenter has switched; wait for the exec of sleep too.
			if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", cmd.Process.Pid)); strings.TrimSpace(string(b)) == "sleep" {
				return cmd
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("process did not enter %s", path)
	return nil
}

// StartHolder starts a process that holds a descriptor open on path (and
// lives in the root namespace) and waits until it holds it.
func StartHolder(t testing.TB, path string) *exec.Cmd {
	t.Helper()
	cmd := Start(t, "sh", "-c", `exec 3<"$1"; exec sleep 600`, "sh", path)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if target, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/3", cmd.Process.Pid)); err == nil && (target == path || strings.HasPrefix(target, "net:")) {
			if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", cmd.Process.Pid)); strings.TrimSpace(string(b)) == "sleep" {
				return cmd
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("process did not open %s", path)
	return nil
}

// Mounts returns the lines of /proc/self/mountinfo that mention dir.
func Mounts(t testing.TB, dir string) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			out = append(out, l)
		}
	}
	return out
}

// HostLinks returns the names of root-namespace links starting with prefix.
func HostLinks(t testing.TB, prefix string) []string {
	t.Helper()
	links, err := netlink.LinkList()
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		t.Fatal(err)
	}
	var out []string
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, prefix) {
			out = append(out, l.Attrs().Name)
		}
	}
	return out
}
