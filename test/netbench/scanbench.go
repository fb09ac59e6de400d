package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/network/netns"
	"github.com/phasegate/phasegate/network/slot"
)

// scanRow is one N of the scan benchmark.
type scanRow struct {
	n      int
	create time.Duration
	// Medians over the reps, per part and in total.
	oldDir, oldLinks, set, newDir, newLinks time.Duration
	oldTotal, newTotal                      time.Duration
	oldAll, newAll                          []time.Duration
}

// scanBench makes slots up to each size in turn (once: 1,000 then 4,000 more,
// and so on) and, at each size, times the scan of the previous commit
// (oldScan) and slot.Manager.Survey, alternately, reps times each. The two
// must find the same inventory.
func (b *bench) scanBench(sizes []int, reps int) ([]scanRow, error) {
	ctx := context.Background()
	made := 0
	var rows []scanRow
	for _, n := range sizes {
		fmt.Fprintf(os.Stderr, "scan: make slots %d..%d...\n", made+1, n)
		t0 := time.Now()
		if err := b.leakRange(made+1, n); err != nil {
			return rows, err
		}
		made = n
		row := scanRow{n: n, create: time.Since(t0)}
		time.Sleep(2 * time.Second)
		var od, ol, st, nd, nl []time.Duration
		for r := range reps {
			// Alternate which goes first, so neither always runs on a
			// cache the other warmed.
			runOld := func() error {
				inv, parts, err := oldScan(ctx, b.cfg, b.m)
				if err != nil {
					return err
				}
				if len(inv) != n {
					return fmt.Errorf("old scan found %d slots, want %d", len(inv), n)
				}
				od, ol, st = append(od, parts[0]), append(ol, parts[1]), append(st, parts[2])
				row.oldAll = append(row.oldAll, parts[0]+parts[1]+parts[2])
				return nil
			}
			runNew := func() error {
				total, dir, links, err := b.timeSurvey(ctx, n)
				if err != nil {
					return err
				}
				row.newAll, nd, nl = append(row.newAll, total), append(nd, dir), append(nl, links)
				return nil
			}
			first, second := runOld, runNew
			if r%2 == 1 {
				first, second = runNew, runOld
			}
			if err := first(); err != nil {
				return rows, err
			}
			if err := second(); err != nil {
				return rows, err
			}
		}
		row.oldDir, row.oldLinks, row.set = median(od), median(ol), median(st)
		row.newDir, row.newLinks = median(nd), median(nl)
		row.oldTotal, row.newTotal = median(row.oldAll), median(row.newAll)
		fmt.Fprintf(os.Stderr, "  N=%d old %v (dir %v, links %v, set %v) new %v (dir %v, links %v)\n", n,
			row.oldTotal, row.oldDir, row.oldLinks, row.set, row.newTotal, row.newDir, row.newLinks)
		rows = append(rows, row)
	}
	fmt.Fprintln(os.Stderr, "scan: tear down...")
	if res := b.m.Teardown(ctx, slot.Assume(seq(1, made)...), slot.TeardownOptions{}); res.Err() != nil {
		return rows, res.Err()
	}
	return rows, b.settle()
}

// timeSurvey times slot.Manager.Survey of the n slots made, which must
// find them all whole, and then its parts apart: the netns directory's
// survey and the links' names.
func (b *bench) timeSurvey(ctx context.Context, n int) (total, dir, links time.Duration, err error) {
	t := time.Now()
	sr, err := b.m.Survey(ctx)
	total = time.Since(t)
	if err != nil {
		return 0, 0, 0, err
	}
	if len(sr.Inventory) != n || len(sr.Unreadable) != 0 {
		return 0, 0, 0, fmt.Errorf("new scan found %d slots (%d unreadable), want %d", len(sr.Inventory), len(sr.Unreadable), n)
	}
	for i, r := range sr.Inventory {
		if r != slot.All {
			return 0, 0, 0, fmt.Errorf("new scan: slot %d has %v", i, r)
		}
	}
	// Its parts, timed apart (not in the total).
	t = time.Now()
	if _, err := netns.Survey(b.cfg.NetnsDir, func(name string) bool {
		_, ok := b.cfg.CanonicalNetnsIndex(name)
		return ok
	}); err != nil {
		return 0, 0, 0, err
	}
	dir = time.Since(t)
	t = time.Now()
	if _, err := readNetDevNames(); err != nil {
		return 0, 0, 0, err
	}
	return total, dir, time.Since(t), nil
}

func seq(from, to int) []int {
	out := make([]int, 0, max(to-from+1, 0))
	for i := from; i <= to; i++ {
		out = append(out, i)
	}
	return out
}

// oldScan is the scan of commit 90f4cc6, kept here as the baseline: a
// directory listing with lstat + statfs (+ statx) by path per entry, an
// RTM_GETLINK dump parsed by hand, and the set listing. It returns the time
// of each of the three parts.
func oldScan(ctx context.Context, cfg slot.Config, m *slot.Manager) (slot.Inventory, [3]time.Duration, error) {
	var parts [3]time.Duration
	inv := slot.Inventory{}
	t := time.Now()
	entries, err := netns.List(cfg.NetnsDir, cfg.Prefix)
	if err != nil {
		return nil, parts, err
	}
	for _, e := range entries {
		if e.Kind != netns.KindFile {
			continue
		}
		if i, ok := cfg.ParseNetnsName(e.Name); ok && oldInspect(cfg.NetnsPath(i)) {
			inv[i] |= slot.HasNetns
		}
	}
	parts[0] = time.Since(t)
	t = time.Now()
	names, err := dumpLinkNames()
	if err != nil {
		return nil, parts, err
	}
	for _, n := range names {
		if i, ok := cfg.ParseHostIfName(n); ok {
			inv[i] |= slot.HasHostLink
		}
	}
	parts[1] = time.Since(t)
	t = time.Now()
	els, err := m.Firewall().List(ctx)
	if err != nil {
		return nil, parts, err
	}
	for _, n := range els {
		if i, ok := cfg.ParseHostIfName(n); ok {
			inv[i] |= slot.HasElement
		}
	}
	parts[2] = time.Since(t)
	return inv, parts, nil
}

// oldInspect is netns.Inspect of commit 90f4cc6 (path-based): true for a
// bound namespace or a placeholder.
func oldInspect(path string) bool {
	var st unix.Stat_t
	if unix.Lstat(path, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return false
	}
	var fs unix.Statfs_t
	if unix.Statfs(path, &fs) != nil {
		return false
	}
	if fs.Type == unix.NSFS_MAGIC {
		return true
	}
	var stx unix.Statx_t
	err := unix.Statx(unix.AT_FDCWD, path, unix.AT_SYMLINK_NOFOLLOW|unix.AT_STATX_DONT_SYNC, unix.STATX_BASIC_STATS, &stx)
	if err == nil && stx.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT != 0 && stx.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0 {
		return false
	}
	return st.Size == 0
}

// dumpLinkNames is the link listing of commit 90f4cc6: one RTM_GETLINK dump,
// parsing only IFLA_IFNAME.
func dumpLinkNames() ([]string, error) {
	var (
		msgs [][]byte
		err  error
	)
	for range 2 {
		req := nl.NewNetlinkRequest(unix.RTM_GETLINK, unix.NLM_F_DUMP)
		req.AddData(nl.NewIfInfomsg(unix.AF_UNSPEC))
		msgs, err = req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWLINK)
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return nil, err
	}
	out := make([]string, 0, len(msgs))
	for _, m := range msgs {
		if len(m) < unix.SizeofIfInfomsg {
			continue
		}
		for b := m[unix.SizeofIfInfomsg:]; len(b) >= unix.SizeofRtAttr; {
			l := int(binary.NativeEndian.Uint16(b[0:2]))
			if l < unix.SizeofRtAttr || l > len(b) {
				break
			}
			if binary.NativeEndian.Uint16(b[2:4]) == unix.IFLA_IFNAME {
				name := b[unix.SizeofRtAttr:l]
				if i := bytes.IndexByte(name, 0); i >= 0 {
					name = name[:i]
				}
				out = append(out, string(name))
				break
			}
			b = b[min((l+unix.RTA_ALIGNTO-1)&^(unix.RTA_ALIGNTO-1), len(b)):]
		}
	}
	return out, nil
}

// readNetDevNames times what the new scan does for links (the parse is
// slot's own; here the read and a rough split are enough for the split).
func readNetDevNames() (int, error) {
	b, err := os.ReadFile("/proc/thread-self/net/dev")
	if err != nil {
		return 0, err
	}
	return bytes.Count(b, []byte{'\n'}), nil
}

func (r *results) scanMarkdown(rows []scanRow, reps int) string {
	var b strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	w("# Scan benchmark\n\n")
	w("Measured by `test/netbench -mode scan` on the real kernel, as root, in one run. Reproduce with:\n\n")
	w("```sh\n# as root, from the repository root\n%s\n```\n\n", r.cmd)
	w("Machine: Linux %s, %s, %s. Load average at start %s, at end %s.\n\n", r.kernel, r.cpu, r.goVersion, r.loadStart, r.loadEnd)
	w("N full slots (netns + veth pair + set element) are made once, in a directory and prefix of the benchmark's own; at each N\n"+
		"the scan of commit 90f4cc6 (**old**: directory listing with lstat + statfs by path per entry, an RTM_GETLINK dump, the\n"+
		"set listing) and `slot.Manager.Survey` (**new**: one directory read and one mountinfo read, /proc/net/dev, the set\n"+
		"listing) run alternately, %d times each; medians. Both must find the N slots.\n\n", reps)
	w("| N | old: median | old: ns/slot | new: median | new: ns/slot | new: slots/s | speed-up | old: fastest | new: fastest | new fastest: slots/s |\n")
	w("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, row := range rows {
		oldMin, newMin := slices.Min(row.oldAll), slices.Min(row.newAll)
		w("| %d | %s | %.0f | %s | %.0f | %.0f | %.1f× | %s | %s | %.0f |\n", row.n, ms(row.oldTotal), perSlot(row.oldTotal, row.n),
			ms(row.newTotal), perSlot(row.newTotal, row.n), float64(row.n)/row.newTotal.Seconds(),
			float64(row.oldTotal)/float64(row.newTotal), ms(oldMin), ms(newMin), float64(row.n)/newMin.Seconds())
	}
	w("\nWhere the time goes (medians, ns per slot; the new parts timed apart from the new total):\n\n")
	w("| N | old: directory | old: link dump | set listing (both) | new: directory + mountinfo | new: /proc/net/dev read |\n|---:|---:|---:|---:|---:|---:|\n")
	for _, row := range rows {
		w("| %d | %.0f | %.0f | %.0f | %.0f | %.0f |\n", row.n, perSlot(row.oldDir, row.n), perSlot(row.oldLinks, row.n),
			perSlot(row.set, row.n), perSlot(row.newDir, row.n), perSlot(row.newLinks, row.n))
	}
	w("\nEvery run (ms):\n\n")
	for _, row := range rows {
		w("- N=%d: old %s; new %s; making the slots up to N took %s\n", row.n, msList(row.oldAll), msList(row.newAll), ms(row.create))
	}
	return b.String()
}

func perSlot(d time.Duration, n int) float64 { return float64(d.Nanoseconds()) / float64(n) }

func msList(ds []time.Duration) string {
	s := make([]string, len(ds))
	for k, d := range ds {
		s[k] = fmt.Sprintf("%.1f", float64(d.Microseconds())/1000)
	}
	return strings.Join(s, ", ")
}
