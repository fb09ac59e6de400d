package shape

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/phasegate/phasegate/network/internal/netconf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Link names a slot's devices in the host's namespace: its host end, and
// the ifb its traffic out is shaped on.
type Link struct {
	Host, Ifb string
}

// ErrNoLink is a host end that does not exist (a slot torn down, or its
// link deleted from outside, which the reconciler makes again).
var ErrNoLink = errors.New("no such host link")

// latency is how long tbf queues a packet beyond the burst before it
// drops it: as CNI's bandwidth plugin does, 25 ms.
const latency = 25 * time.Millisecond

// The handles of the qdiscs this package writes.
var (
	rootHandle    = netlink.MakeHandle(1, 0)
	ingressHandle = netlink.MakeHandle(0xffff, 0)
)

// tbfOf is the tbf that holds a direction to rate bit/s with burst bits
// at the root of link index: its bucket in the kernel's ticks, its queue
// what latency carries at the rate, plus the burst.
func tbfOf(index int, rate, burst uint64) *netlink.Tbf {
	bps, b := rate/8, burst/8
	return &netlink.Tbf{
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: index, Handle: rootHandle, Parent: netlink.HANDLE_ROOT},
		Rate:       bps,
		Buffer:     netlink.Xmittime(bps, uint32(b)),
		Limit:      uint32(bps*uint64(latency)/uint64(time.Second) + b),
	}
}

// Apply sets limits l (validated, with their defaults) on link: into the
// slot on the host end's root, out of it on the ifb the host end's
// ingress redirects to, made when missing. A direction l does not shape
// is cleared. Idempotent: what is set already is replaced in place, so a
// limit changed on a live lease never leaves the link unshaped.
func Apply(ctx context.Context, link Link, l Limits) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	host, err := hostLink(link.Host)
	if err != nil {
		return err
	}
	if l.IngressRate > 0 {
		if err := netlink.QdiscReplace(tbfOf(host.Attrs().Index, l.IngressRate, l.IngressBurst)); err != nil {
			return fmt.Errorf("shape: %s: replace root tbf: %w", link.Host, err)
		}
	} else if err := delRoot(host); err != nil {
		return err
	}
	if l.EgressRate > 0 {
		return applyEgress(host, link.Ifb, l.EgressRate, l.EgressBurst)
	}
	return clearEgress(host, link.Ifb)
}

// Clear removes every limit of link: the host end's qdiscs (a missing
// host end has none) and its ifb.
func Clear(ctx context.Context, link Link) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	host, err := hostLink(link.Host)
	switch {
	case errors.Is(err, ErrNoLink):
		return DeleteIfb(link.Ifb)
	case err != nil:
		return err
	}
	if err := delRoot(host); err != nil {
		return err
	}
	return clearEgress(host, link.Ifb)
}

func hostLink(name string) (netlink.Link, error) {
	l, err := netlink.LinkByName(name)
	var nf netlink.LinkNotFoundError
	if errors.As(err, &nf) {
		return nil, fmt.Errorf("shape: %s: %w", name, ErrNoLink)
	}
	if err != nil {
		return nil, fmt.Errorf("shape: %s: get link: %w", name, err)
	}
	return l, nil
}

// applyEgress shapes what leaves the slot through host on ifb.
func applyEgress(host netlink.Link, ifbName string, rate, burst uint64) error {
	ifb, err := ensureIfb(ifbName)
	if err != nil {
		return err
	}
	if err := netlink.QdiscReplace(tbfOf(ifb.Attrs().Index, rate, burst)); err != nil {
		return fmt.Errorf("shape: %s: replace root tbf: %w", ifbName, err)
	}
	ok, err := redirects(host, ifb.Attrs().Index)
	if err != nil || ok {
		return err
	}
	in := &netlink.Ingress{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: host.Attrs().Index, Handle: ingressHandle, Parent: netlink.HANDLE_INGRESS}}
	// A filter of another kind, or to another device, goes with the
	// qdisc: one filter is what Survey and Repair read.
	if err := netlink.QdiscDel(in); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("shape: %s: delete ingress qdisc: %w", host.Attrs().Name, err)
	}
	if err := netlink.QdiscAdd(in); err != nil {
		return fmt.Errorf("shape: %s: add ingress qdisc: %w", host.Attrs().Name, err)
	}
	f := &netlink.U32{
		FilterAttrs: netlink.FilterAttrs{LinkIndex: host.Attrs().Index, Parent: ingressHandle, Priority: 1, Protocol: unix.ETH_P_ALL},
		ClassId:     netlink.MakeHandle(1, 1),
		Actions:     []netlink.Action{netlink.NewMirredAction(ifb.Attrs().Index)},
	}
	if err := netlink.FilterAdd(f); err != nil {
		return fmt.Errorf("shape: %s: add u32 filter redirecting to %s: %w", host.Attrs().Name, ifbName, err)
	}
	return nil
}

// ensureIfb returns the ifb named name, made and up.
func ensureIfb(name string) (netlink.Link, error) {
	l, err := netlink.LinkByName(name)
	var nf netlink.LinkNotFoundError
	if errors.As(err, &nf) {
		err = netlink.LinkAdd(&netlink.Ifb{LinkAttrs: netlink.LinkAttrs{Name: name, TxQLen: 1000}})
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return nil, fmt.Errorf("shape: %s: add ifb: %w", name, err)
		}
		l, err = netlink.LinkByName(name)
	}
	if err != nil {
		return nil, fmt.Errorf("shape: %s: get link: %w", name, err)
	}
	if _, ok := l.(*netlink.Ifb); !ok {
		return nil, fmt.Errorf("shape: %s is a %s, not an ifb: not ours", name, l.Type())
	}
	if l.Attrs().Flags&unix.IFF_UP == 0 {
		// Before it is first up: an ifb with IPv6 would add a link-local
		// address and routes to the host's tables per lease with limits,
		// which every read of the host's addresses and routes (a start's
		// among them) then walks.
		if err := netconf.QuietIPv6(name); err != nil {
			return nil, fmt.Errorf("shape: %s: %w", name, err)
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return nil, fmt.Errorf("shape: %s: set up: %w", name, err)
		}
	}
	return l, nil
}

// redirects reports whether host's ingress holds exactly one filter, a
// redirect of everything to ifindex.
func redirects(host netlink.Link, ifindex int) (bool, error) {
	fs, err := netlink.FilterList(host, ingressHandle)
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
		return false, nil // no ingress qdisc
	}
	if err != nil {
		return false, fmt.Errorf("shape: %s: list ingress filters: %w", host.Attrs().Name, err)
	}
	n := 0
	for _, f := range fs {
		u, ok := f.(*netlink.U32)
		if !ok {
			return false, nil
		}
		if len(u.Actions) == 0 {
			continue // the u32 hash table's own entry
		}
		m, ok := u.Actions[0].(*netlink.MirredAction)
		if !ok || m.Ifindex != ifindex || m.MirredAction != netlink.TCA_EGRESS_REDIR {
			return false, nil
		}
		n++
	}
	return n == 1, nil
}

// delRoot deletes host's root tbf, if any.
func delRoot(host netlink.Link) error {
	q := &netlink.Tbf{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: host.Attrs().Index, Handle: rootHandle, Parent: netlink.HANDLE_ROOT}}
	if err := netlink.QdiscDel(q); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("shape: %s: delete root qdisc: %w", host.Attrs().Name, err)
	}
	return nil
}

// clearEgress removes host's redirect and the ifb.
func clearEgress(host netlink.Link, ifbName string) error {
	in := &netlink.Ingress{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: host.Attrs().Index, Handle: ingressHandle, Parent: netlink.HANDLE_INGRESS}}
	if err := netlink.QdiscDel(in); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("shape: %s: delete ingress qdisc: %w", host.Attrs().Name, err)
	}
	return DeleteIfb(ifbName)
}

// DeleteIfb deletes the ifb named name (a slot's, when its slot goes); a
// missing one is fine, a link of the name that is no ifb is left alone.
func DeleteIfb(name string) error {
	ifbs, failed := ifbsNamed([]string{name})
	deleteEach(ifbs, failed)
	return failed[name]
}
