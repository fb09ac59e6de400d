package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/network/netns"
	"github.com/phasegate/phasegate/network/nft"
	"github.com/phasegate/phasegate/network/slot"
	"github.com/phasegate/phasegate/phases"
	"github.com/phasegate/phasegate/phases/lockfile"
)

// maxSlots bounds N: with spareSlots, the default slot CIDR's 16,384 /31s.
const maxSlots = 15000

// spareSlots are indices beyond the most any part leaks or leases at once:
// the warm pool, its refills, the slots Acquires make during a reclaim.
const spareSlots = 512

// leakWorkers is the number of goroutines that make namespaces for a leak.
const leakWorkers = 8

// host is this run's share of the machine: a unique prefix, a temporary
// netns directory and state directory. Nothing without the prefix is ever
// touched.
type host struct {
	cfg      slot.Config
	base     string
	stateDir string // on tmpfs, as /run is on a systemd host
	lockPath string // the daemon's lock file for our slots (outside base)
	// leaked are the host ends of the last leaked set.
	leaked []hostLink
	// kernel is the machine's count of network namespaces at the start,
	// which settle waits to get back to.
	kernel *kernelBaseline
}

// randomPrefix returns "bz", four random lowercase letters and "-".
func randomPrefix() string {
	b := []byte("bz")
	for range 4 {
		b = append(b, byte('a'+rand.IntN(26)))
	}
	return string(b) + "-"
}

// newHost makes the temporary directories (the state directory under
// stateParent) and a slot configuration for up to slots indices.
func newHost(slots int, cidr, stateParent string) (*host, error) {
	p, err := netip.ParsePrefix(cidr)
	if err != nil {
		return nil, fmt.Errorf("-cidr: %w", err)
	}
	base, err := os.MkdirTemp("", "phasegate-bench-")
	if err != nil {
		return nil, fmt.Errorf("temp dir: %w", err)
	}
	state, err := os.MkdirTemp(stateParent, "phasegate-bench-state-")
	if err != nil {
		os.RemoveAll(base)
		return nil, fmt.Errorf("-state-parent: %w", err)
	}
	h := &host{
		cfg: slot.Config{
			Prefix:   randomPrefix(),
			NetnsDir: filepath.Join(base, "netns"),
			Slots:    slots,
			CIDR:     p,
		},
		base:     base,
		stateDir: state,
		kernel:   newKernelBaseline(),
	}
	fail := func(err error) (*host, error) {
		os.RemoveAll(base)
		os.RemoveAll(state)
		return nil, err
	}
	if err := h.cfg.Validate(); err != nil {
		return fail(fmt.Errorf("slot config: %w", err))
	}
	if h.lockPath, err = lockfile.SlotsPath(lockfile.DefaultDir, h.cfg.NetnsDir, h.cfg.Prefix); err != nil {
		return fail(err)
	}
	if err := netns.PrepareDir(h.cfg.NetnsDir); err != nil {
		return fail(err)
	}
	return h, nil
}

// controlSocket is the control socket of a daemon on h: in its state
// directory, as daemonArgs leave it.
func (h *host) controlSocket() string {
	return filepath.Join(h.stateDir, phases.ControlSocketName)
}

// table returns the nftables table the daemon uses for this prefix.
func (h *host) table() (*nft.Table, error) {
	return nft.New(h.cfg.TableName(), nft.WithSlotNetwork(h.cfg.CIDR))
}

// leak makes slots 1..n the way a killed daemon leaves them: a netns file
// <prefix><i>, a veth pair whose host end <prefix>h<i> is up with its /31
// address and whose peer eth0 is inside the namespace, and the host end's
// name in the nftables set.
func (h *host) leak(ctx context.Context, n int) error {
	if n == 0 {
		return nil
	}
	if err := h.makeNamespaces(ctx, n); err != nil {
		return err
	}
	if err := h.makeVeths(ctx, n); err != nil {
		return err
	}
	tbl, err := h.table()
	if err != nil {
		return err
	}
	if err := tbl.Ensure(ctx); err != nil {
		return fmt.Errorf("leak: nftables table: %w", err)
	}
	names := make([]string, 0, n)
	for i := 1; i <= n; i++ {
		names = append(names, h.cfg.HostIfName(i))
	}
	if err := tbl.Add(ctx, names...); err != nil {
		return fmt.Errorf("leak: set elements: %w", err)
	}
	if h.leaked, err = h.hostLinkIndices(); err != nil {
		return fmt.Errorf("leak: %w", err)
	}
	if len(h.leaked) != n {
		return fmt.Errorf("leak: %d host ends, want %d", len(h.leaked), n)
	}
	return nil
}

// makeNamespaces creates netns files 1..n with a few workers.
func (h *host) makeNamespaces(ctx context.Context, n int) error {
	next := make(chan int)
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for range leakWorkers {
		wg.Go(func() {
			for i := range next {
				if _, err := netns.Create(ctx, h.cfg.NetnsDir, h.cfg.NetnsName(i)); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		})
	}
	for i := 1; i <= n && ctx.Err() == nil; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("leak: %w", err)
	}
	if len(errs) > 0 {
		return fmt.Errorf("leak: %d namespaces failed: %w", len(errs), errs[0])
	}
	return nil
}

// makeVeths adds the veth pairs of slots 1..n with one `ip -batch`.
func (h *host) makeVeths(ctx context.Context, n int) error {
	var batch bytes.Buffer
	for i := 1; i <= n; i++ {
		s := h.cfg.Slot(i)
		fmt.Fprintf(&batch, "link add %s type veth peer name %s netns %s\n", s.HostIf, slot.InsideIfName, s.NetnsPath)
		fmt.Fprintf(&batch, "addr add %s dev %s\n", s.HostAddr, s.HostIf)
		fmt.Fprintf(&batch, "link set %s up\n", s.HostIf)
	}
	file := filepath.Join(h.base, "leak.batch")
	if err := os.WriteFile(file, batch.Bytes(), 0o600); err != nil {
		return fmt.Errorf("leak: %w", err)
	}
	defer os.Remove(file)
	out, err := exec.CommandContext(ctx, "ip", "-batch", file).CombinedOutput()
	if err != nil {
		return fmt.Errorf("leak: ip -batch: %w: %.500s", err, out)
	}
	return nil
}

// leftovers counts what exists with our prefix: netns files, host links,
// set elements.
func (h *host) leftovers(ctx context.Context) (files, links, elements int, err error) {
	ents, err := os.ReadDir(h.cfg.NetnsDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return 0, 0, 0, err
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), h.cfg.Prefix) {
			files++
		}
	}
	left, err := h.linksNamed(h.cfg.HostIfPrefix(), h.cfg.ShaperIfPrefix())
	if err != nil {
		return 0, 0, 0, err
	}
	links = len(left)
	if tbl, err := h.table(); err == nil {
		if ok, err := tbl.Exists(ctx); err == nil && ok {
			els, err := tbl.List(ctx)
			if err != nil {
				return 0, 0, 0, err
			}
			elements = len(els)
		}
	}
	return files, links, elements, nil
}

// hostLink is a root-namespace link known by index and name.
type hostLink struct {
	index int
	name  string
}

// hostLinkIndices lists the root namespace's links named <prefix>h*.
func (h *host) hostLinkIndices() ([]hostLink, error) {
	return h.linksNamed(h.cfg.HostIfPrefix())
}

// linksNamed lists the root namespace's links whose names start with one
// of prefixes. A dump the kernel reports as interrupted (links came or
// went meanwhile) is retried.
func (h *host) linksNamed(prefixes ...string) ([]hostLink, error) {
	var (
		links []netlink.Link
		err   error
	)
	for range 5 {
		if links, err = netlink.LinkList(); !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return nil, fmt.Errorf("list links: %w", err)
	}
	var out []hostLink
	for _, l := range links {
		if a := l.Attrs(); slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(a.Name, p) }) {
			out = append(out, hostLink{index: a.Index, name: a.Name})
		}
	}
	return out, nil
}

// settle waits (up to a minute) until nothing with our prefix is left, then
// until the kernel has torn down the namespaces the run left (h.kernel),
// removes the nftables table so every run starts from the same state, and
// pauses for what the kernel still does after that (RCU callbacks, freeing
// memory), so that the previous run's clean-up does not overlap the next
// one. What is still left after the first wait is swept and reported as an
// error.
func (h *host) settle(ctx context.Context, pause time.Duration) error {
	deadline := time.Now().Add(time.Minute)
	for {
		files, links, _, err := h.leftovers(ctx)
		if err != nil {
			return err
		}
		if files == 0 && links == 0 {
			break
		}
		if time.Now().After(deadline) {
			sweepErr := h.sweep()
			return errors.Join(fmt.Errorf("after a run: %d netns files and %d host links left", files, links), sweepErr)
		}
		if err := sleep(ctx, 20*time.Millisecond); err != nil {
			return err
		}
	}
	if err := h.kernel.wait(ctx); err != nil {
		return fmt.Errorf("after a run: the kernel's namespaces: %w", err)
	}
	if err := h.dropTable(ctx); err != nil {
		return err
	}
	return sleep(ctx, pause)
}

// dropTable deletes our nftables table if it exists.
func (h *host) dropTable(ctx context.Context) error {
	tbl, err := h.table()
	if err != nil {
		return err
	}
	ok, err := tbl.Exists(ctx)
	if err != nil || !ok {
		return err
	}
	return tbl.Delete(ctx)
}

// sweep removes everything with our prefix: netns files (and their mounts),
// the netns directory's own bind mount, host links, the nftables table and
// the temporary directories. It is safe to call more than once.
func (h *host) sweep() error {
	var errs []error
	ents, _ := os.ReadDir(h.cfg.NetnsDir)
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), h.cfg.Prefix) {
			continue
		}
		p := filepath.Join(h.cfg.NetnsDir, e.Name())
		for unix.Unmount(p, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW) == nil {
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	for unix.Unmount(h.cfg.NetnsDir, unix.MNT_DETACH) == nil {
	}
	// The kernel removes a veth pair with its namespace, in the
	// background: delete only what is still there after a while (a pair
	// whose namespace something keeps alive).
	links, err := h.hostLinkIndices()
	if err == nil && len(links) > 0 {
		_ = waitLinksGone(context.Background(), links, 30*time.Second)
		links, err = linksPresent(links)
	}
	errs = append(errs, err)
	ifbs, err := h.linksNamed(h.cfg.ShaperIfPrefix()) // ifbs never go with a namespace
	errs = append(errs, err)
	for _, l := range append(links, ifbs...) {
		if err := netlink.LinkDel(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Index: l.index}}); err != nil &&
			!errors.Is(err, unix.ENODEV) {
			errs = append(errs, fmt.Errorf("delete link %s (index %d): %w", l.name, l.index, err))
		}
	}
	errs = append(errs, h.dropTable(context.Background()))
	for _, p := range []string{h.base, h.stateDir, h.lockPath} {
		if err := os.RemoveAll(p); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// slotID is the kernel identity of a slot's objects: its netns file's
// inode and its host veth's ifindex. A slot destroyed and made again under
// the same name has another (the inode may be reused at once, the ifindex
// is not).
type slotID struct {
	netns   netns.ID
	ifindex int
}

// identities returns the identity of each of indices that exists now.
func (h *host) identities(indices []int) (map[int]slotID, error) {
	links, err := h.hostLinkIndices()
	if err != nil {
		return nil, err
	}
	byName := make(map[string]int, len(links))
	for _, l := range links {
		byName[l.name] = l.index
	}
	out := make(map[int]slotID, len(indices))
	for _, i := range indices {
		id, err := netns.Stat(h.cfg.NetnsPath(i))
		ifindex, ok := byName[h.cfg.HostIfName(i)]
		if err != nil || !ok {
			continue
		}
		out[i] = slotID{netns: id, ifindex: ifindex}
	}
	return out, nil
}

// changed counts the slots of before that are gone or not the same now.
func changed(before, now map[int]slotID) int {
	n := 0
	for i, id := range before {
		if now[i] != id {
			n++
		}
	}
	return n
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
