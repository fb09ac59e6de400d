package slot

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"strconv"
	"sync"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/network/internal/procfs"
)

// A slot must never inherit the host's conntrack entries of the slot that
// was at its index before: a reply to the earlier tenant's connection
// would be translated and delivered to the new one. Those entries can only
// be made while the earlier slot's host link exists, so one pass over the
// host's table made after the link is gone removes them for good.
//
// Such a pass costs a walk of the whole conntrack hash table in the kernel
// whatever the number of entries, and it was made twice (orig source, orig
// destination) for every slot created, which capped the rate of slot
// creation whatever the concurrency (figures: docs/BENCHMARKS.md, "Figures
// behind the network code"). So the passes are shared: the manager knows
// which indices have had no slot since a moment it observed, and one pass
// clears every such index at once. A Create waits for a pass that started
// after its index's last slot was gone, or none if one has run since; the
// Creates that arrive during a pass wait together for the next one (as a
// group commit does).

// ctState is what the cleaner knows of an index. The zero value (absent
// from the map) is "unknown": a slot of an earlier run may be there.
type ctState struct {
	busy   bool   // a slot of ours may exist (being made, in use, being torn down)
	goneAt uint64 // the cleaner's clock when the index was seen without a slot
	clean  bool   // a pass that started after goneAt has cleared the index
}

// ctPass is one pass over the host's conntrack table.
type ctPass struct {
	start uint64        // the cleaner's clock when it started
	done  chan struct{} // closed when it ended
	err   error         // set before done is closed
}

// ctCleaner shares the conntrack passes of a manager's creations.
type ctCleaner struct {
	addr func(i int) netip.Addr // the inside address of index i

	mu    sync.Mutex
	clock uint64
	state map[int]ctState
	pass  *ctPass // the pass under way, nil if none
}

func newCTCleaner(addr func(int) netip.Addr) *ctCleaner {
	return &ctCleaner{addr: addr, state: map[int]ctState{}}
}

// busy marks indices where a slot of ours is about to exist or is being
// torn down: no pass counts for them until they are seen gone again.
func (c *ctCleaner) busy(indices ...int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, i := range indices {
		c.state[i] = ctState{busy: true}
	}
}

// gone marks indices that have no slot now (their teardown ended, their
// host link included).
func (c *ctCleaner) gone(indices ...int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.clock++
	for _, i := range indices {
		c.state[i] = ctState{goneAt: c.clock}
	}
}

// seenGone marks i as without a slot now unless it is known to be so
// already (a clean index stays clean).
func (c *ctCleaner) seenGone(i int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if st, ok := c.state[i]; !ok || st.busy {
		c.clock++
		c.state[i] = ctState{goneAt: c.clock}
	}
}

// goneIfUnknown marks the indices nothing is known of, which a survey found
// without a slot. An index a Create or a teardown of ours touched since is
// left as they said.
func (c *ctCleaner) goneIfUnknown(indices []int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.clock++
	for _, i := range indices {
		if _, ok := c.state[i]; !ok {
			c.state[i] = ctState{goneAt: c.clock}
		}
	}
}

// await returns once index i, seen gone, has been cleared by a pass that
// started after that: at once if one has run, after the pass under way if
// it started late enough, and otherwise after a pass this call starts for
// every index that needs one.
func (c *ctCleaner) await(ctx context.Context, i int) error {
	for {
		c.mu.Lock()
		st := c.state[i]
		if st.clean {
			c.mu.Unlock()
			return nil
		}
		if st.busy || st.goneAt == 0 {
			c.mu.Unlock()
			return fmt.Errorf("slot: conntrack: index %d was not seen without a slot", i)
		}
		if p := c.pass; p != nil {
			c.mu.Unlock()
			select {
			case <-p.done:
			case <-ctx.Done():
				return ctx.Err()
			}
			if p.err != nil && p.start > st.goneAt {
				return p.err
			}
			continue
		}
		p, addrs := c.startPass()
		c.mu.Unlock()
		return c.run(p, addrs)
	}
}

// startPass starts a pass for every index seen gone and not yet cleared.
// Call with c.mu held.
func (c *ctCleaner) startPass() (*ctPass, map[netip.Addr]int) {
	c.clock++
	p := &ctPass{start: c.clock, done: make(chan struct{})}
	c.pass = p
	addrs := map[netip.Addr]int{}
	for i, st := range c.state {
		if !st.busy && !st.clean {
			addrs[c.addr(i)] = i
		}
	}
	return p, addrs
}

// run makes pass p over addrs, marks the indices it cleared and wakes its
// waiters.
func (c *ctCleaner) run(p *ctPass, addrs map[netip.Addr]int) error {
	err := flushHostConntrack(addrs)
	if err != nil && ignorableConntrack(err) {
		err = nil // no conntrack here: nothing to clear
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err == nil {
		for _, i := range addrs {
			if st := c.state[i]; !st.busy && st.goneAt != 0 && st.goneAt < p.start {
				st.clean = true
				c.state[i] = st
			}
		}
	}
	p.err = err
	c.pass = nil
	close(p.done)
	return err
}

// Attributes of ctnetlink's kernel-side dump filter (Linux 5.8+), not
// exported by the netlink library.
const (
	ctaFilter          = 25 // CTA_FILTER
	ctaFilterOrigFlags = 1  // CTA_FILTER_ORIG_FLAGS
	ctaFilterFIPSrc    = 1 << 0
	ctaFilterFIPDst    = 1 << 1
)

// entryCostInBuckets is what sending and matching one conntrack entry costs
// compared with the kernel's visit of one empty bucket of the hash table:
// an estimate, not a measurement with a full table, from the cost of a
// bucket and of an entry sent and parsed (docs/BENCHMARKS.md, "Figures
// behind the network code").
const entryCostInBuckets = 100

// flushHostConntrack deletes the root namespace's IPv4 conntrack entries
// that have one of addrs in their original or reply direction, source or
// destination. Each dump walks the whole hash table in the kernel; the
// kernel's filter matches only one exact address per dump, two dumps an
// address. So when the table holds few entries compared with its buckets
// times the addresses, one dump of everything, matched here, costs less.
func flushHostConntrack(addrs map[netip.Addr]int) error {
	if len(addrs) == 0 {
		return nil
	}
	if count, buckets, ok := conntrackSize(); ok && count*entryCostInBuckets > 2*len(addrs)*buckets {
		var errs []error
		for a := range addrs {
			if err := flushOneAddr(a); err != nil {
				errs = append(errs, err)
			}
		}
		return errors.Join(errs...)
	}
	return flushMatching(addrs)
}

// conntrackSize reads the root namespace's conntrack entry count and hash
// table size; ok is false when they cannot be read (no conntrack).
func conntrackSize() (count, buckets int, ok bool) {
	read := func(name string) (int, bool) {
		b, err := procfs.ReadFile("/proc/sys/net/netfilter/" + name)
		if err != nil {
			return 0, false
		}
		n, err := strconv.Atoi(string(bytes.TrimSpace(b)))
		return n, err == nil
	}
	count, ok1 := read("nf_conntrack_count")
	buckets, ok2 := read("nf_conntrack_buckets")
	return count, buckets, ok1 && ok2
}

// flushOneAddr deletes the entries whose original source or destination is
// addr with two kernel-filtered dumps, or one dump of everything on a
// kernel without dump filters.
func flushOneAddr(addr netip.Addr) error {
	var errs []error
	for _, flag := range []uint32{ctaFilterFIPSrc, ctaFilterFIPDst} {
		if err := flushFiltered(addr, flag); err != nil {
			if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP) {
				return flushMatching(map[netip.Addr]int{addr: 0})
			}
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func ctRequest(op, flags int) *nl.NetlinkRequest {
	req := nl.NewNetlinkRequest((int(netlink.ConntrackTable)<<8)|op, flags)
	req.AddData(&nl.Nfgenmsg{NfgenFamily: unix.AF_INET, Version: nl.NFNETLINK_V0})
	return req
}

func flushFiltered(addr netip.Addr, flag uint32) error {
	a := addr.As4()
	attr := nl.CTA_IP_V4_SRC
	if flag == ctaFilterFIPDst {
		attr = nl.CTA_IP_V4_DST
	}
	req := ctRequest(nl.IPCTNL_MSG_CT_GET, unix.NLM_F_DUMP)
	tuple := nl.NewRtAttr(nl.CTA_TUPLE_ORIG|unix.NLA_F_NESTED, nil)
	ip := tuple.AddRtAttr(nl.CTA_TUPLE_IP|unix.NLA_F_NESTED, nil)
	ip.AddRtAttr(attr, a[:])
	req.AddData(tuple)
	filter := nl.NewRtAttr(ctaFilter|unix.NLA_F_NESTED, nil)
	flags := make([]byte, 4)
	binary.NativeEndian.PutUint32(flags, flag)
	filter.AddRtAttr(ctaFilterOrigFlags, flags)
	req.AddData(filter)
	msgs, err := req.Execute(unix.NETLINK_NETFILTER, 0)
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return fmt.Errorf("conntrack dump for %s: %w", addr, err)
	}
	return deleteEntries(msgs, func([]byte) bool { return true })
}

// flushMatching dumps every IPv4 entry (one walk of the table) and deletes
// those that name one of addrs.
func flushMatching(addrs map[netip.Addr]int) error {
	req := ctRequest(nl.IPCTNL_MSG_CT_GET, unix.NLM_F_DUMP)
	msgs, err := req.Execute(unix.NETLINK_NETFILTER, 0)
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return fmt.Errorf("conntrack dump: %w", err)
	}
	return deleteEntries(msgs, func(m []byte) bool { return entryNames(m, addrs) })
}

// deleteEntries deletes the dumped entries msgs (nfgenmsg and attributes)
// that match; one already gone is fine.
func deleteEntries(msgs [][]byte, match func(attrs []byte) bool) error {
	var errs []error
	for _, m := range msgs {
		if len(m) < 4 || !match(m[4:]) {
			continue
		}
		del := ctRequest(nl.IPCTNL_MSG_CT_DELETE, unix.NLM_F_ACK)
		del.AddRawData(m[4:]) // the entry's attributes, after its nfgenmsg
		if _, err := del.Execute(unix.NETLINK_NETFILTER, 0); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("conntrack delete: %w", err))
		}
	}
	return errors.Join(errs...)
}

// entryNames reports whether the entry's attributes attrs hold one of addrs
// as an IPv4 source or destination of its original or reply tuple.
func entryNames(attrs []byte, addrs map[netip.Addr]int) bool {
	top, err := nl.ParseRouteAttr(attrs)
	if err != nil {
		return false
	}
	for _, t := range top {
		if typ := t.Attr.Type & nl.NLA_TYPE_MASK; typ != nl.CTA_TUPLE_ORIG && typ != nl.CTA_TUPLE_REPLY {
			continue
		}
		if tupleNames(t.Value, addrs) {
			return true
		}
	}
	return false
}

func tupleNames(tuple []byte, addrs map[netip.Addr]int) bool {
	ats, err := nl.ParseRouteAttr(tuple)
	if err != nil {
		return false
	}
	for _, a := range ats {
		if a.Attr.Type&nl.NLA_TYPE_MASK != nl.CTA_TUPLE_IP {
			continue
		}
		ips, err := nl.ParseRouteAttr(a.Value)
		if err != nil {
			return false
		}
		for _, ip := range ips {
			if !isV4Addr(ip) {
				continue
			}
			if _, ok := addrs[netip.AddrFrom4([4]byte(ip.Value))]; ok {
				return true
			}
		}
	}
	return false
}

func isV4Addr(a syscall.NetlinkRouteAttr) bool {
	t := a.Attr.Type & nl.NLA_TYPE_MASK
	return (t == nl.CTA_IP_V4_SRC || t == nl.CTA_IP_V4_DST) && len(a.Value) == 4
}

// ignorableConntrack: no conntrack in this namespace (module not loaded).
func ignorableConntrack(err error) bool {
	return errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EPROTONOSUPPORT)
}
