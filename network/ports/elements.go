package ports

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/network/internal/netconf"
	"github.com/phasegate/phasegate/network/netns"
)

// elemsPerMessage bounds the elements in one netlink message (an
// attribute holds at most 64 KiB).
const elemsPerMessage = 1024

// element is e as an element of its map (ports_addr when it names a host
// address, else ports_any): each field of the key and the value padded to
// 4 bytes, ports big-endian.
func element(e Entry) (inAddr bool, el nftables.SetElement) {
	port := func(p uint16) []byte { return []byte{byte(p >> 8), byte(p), 0, 0} }
	key := slices.Concat([]byte{e.Protocol.number(), 0, 0, 0}, port(e.HostPort))
	if e.HostIP.IsValid() {
		a := e.HostIP.Unmap().As4()
		key = slices.Concat(a[:], key)
	}
	to := e.To.Unmap().As4()
	return e.HostIP.IsValid(), nftables.SetElement{Key: key, Val: slices.Concat(to[:], port(e.SlotPort))}
}

// entryOf reads an element of a map back (inAddr: of ports_addr).
func entryOf(inAddr bool, el nftables.SetElement) (Entry, bool) {
	k, v := el.Key, el.Val
	var e Entry
	if inAddr {
		if len(k) < 4 {
			return e, false
		}
		e.HostIP = netip.AddrFrom4([4]byte(k[:4]))
		k = k[4:]
	}
	if len(k) < 8 || len(v) < 8 {
		return e, false
	}
	e.Protocol = protocolOf(k[0])
	e.HostPort = uint16(k[4])<<8 | uint16(k[5])
	e.To = netip.AddrFrom4([4]byte(v[:4]))
	e.SlotPort = uint16(v[4])<<8 | uint16(v[5])
	return e, true
}

// Set replaces the mappings old of the slot at address to, whose host end
// is hostIf, by mappings, in one transaction: an element each, so that its
// cost does not grow with the mappings of other slots. An old element
// already gone is no error. The host end routes 127/8 while the slot has
// a mapping (route_localnet: the host's own connections to 127.0.0.1),
// and no longer once it has none. A missing host end (the slot's link
// gone) is ignored there.
func (t *Table) Set(ctx context.Context, hostIf string, to netip.Addr, old, mappings []Mapping) error {
	entries := func(ms []Mapping) []Entry {
		out := make([]Entry, 0, len(ms))
		for _, m := range ms {
			out = append(out, Entry{Mapping: m, To: to})
		}
		return out
	}
	var del []Entry
	for _, m := range old {
		if !slices.Contains(mappings, m) {
			del = append(del, Entry{Mapping: m, To: to})
		}
	}
	err := t.commit(ctx, del, entries(mappings))
	if errors.Is(err, unix.ENOENT) && len(del) > 0 {
		// An old element was gone (a repair is due anyway): delete only
		// those still there.
		var have []Entry
		if have, err = t.List(ctx); err == nil {
			del = slices.DeleteFunc(del, func(e Entry) bool { return !slices.Contains(have, e) })
			err = t.commit(ctx, del, entries(mappings))
		}
	}
	if err != nil {
		return fmt.Errorf("ports: publish %d and withdraw %d mappings of %s: %w", len(mappings), len(del), to, err)
	}
	if hostIf == "" {
		return nil
	}
	return t.routeLocalnet(hostIf, len(mappings) > 0)
}

// commit deletes del's elements and adds add's, in one transaction.
func (t *Table) commit(ctx context.Context, del, add []Entry) error {
	if len(del) == 0 && len(add) == 0 {
		return nil
	}
	c, release, err := t.fw.Conn(ctx)
	if err != nil {
		return err
	}
	defer release()
	anyMap, addrMap := t.maps()
	for _, op := range []struct {
		entries []Entry
		do      func(*nftables.Set, []nftables.SetElement) error
	}{{del, c.SetDeleteElements}, {add, c.SetAddElements}} {
		var els [2][]nftables.SetElement
		for _, e := range op.entries {
			inAddr, el := element(e)
			if inAddr {
				els[1] = append(els[1], el)
			} else {
				els[0] = append(els[0], el)
			}
		}
		for k, m := range []*nftables.Set{anyMap, addrMap} {
			for chunk := range slices.Chunk(els[k], elemsPerMessage) {
				if err := op.do(m, chunk); err != nil {
					return fmt.Errorf("encode elements of %s: %w", m.Name, err)
				}
			}
		}
	}
	return c.Flush()
}

// List returns every published mapping of the table, with the slot
// address it leads to; none when the table or its maps are missing.
func (t *Table) List(ctx context.Context) ([]Entry, error) {
	c, release, err := t.fw.Conn(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	anyMap, addrMap := t.maps()
	var out []Entry
	for k, m := range []*nftables.Set{anyMap, addrMap} {
		els, err := c.GetSetElements(m)
		if err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue
			}
			if ok, xerr := t.fw.Exists(ctx); xerr == nil && !ok {
				return nil, nil
			}
			return nil, fmt.Errorf("ports: list %s/%s: %w", t.fw.Name(), m.Name, err)
		}
		for _, el := range els {
			if e, ok := entryOf(k == 1, el); ok {
				out = append(out, e)
			}
		}
	}
	return out, nil
}

// Sync makes the maps hold exactly want, in one transaction (what a
// reconcile of the leases' records does): it adds what is missing and
// removes what no lease holds, answering how many of each. links are the
// host ends of the slots with a mapping: each is made to route 127/8 again
// (a link made anew has it off).
func (t *Table) Sync(ctx context.Context, want []Entry, links []string) (added, removed int, err error) {
	have, err := t.List(ctx)
	if err != nil {
		return 0, 0, err
	}
	in := func(l []Entry) map[Entry]bool {
		m := make(map[Entry]bool, len(l))
		for _, e := range l {
			m[e] = true
		}
		return m
	}
	wanted, had := in(want), in(have)
	var add, del []Entry
	for _, e := range want {
		if !had[e] {
			add = append(add, e)
		}
	}
	for _, e := range have {
		if !wanted[e] {
			del = append(del, e)
		}
	}
	if err := t.commit(ctx, del, add); err != nil {
		return 0, 0, fmt.Errorf("ports: sync %d mappings (%d to add, %d to remove): %w", len(want), len(add), len(del), err)
	}
	for _, l := range links {
		if err := t.routeLocalnet(l, true); err != nil {
			return len(add), len(del), err
		}
	}
	return len(add), len(del), nil
}

// routeLocalnet turns route_localnet on or off on the host end hostIf, in
// the table's namespace, in one RTM_SETLINK by name. A missing link is
// ignored.
func (t *Table) routeLocalnet(hostIf string, on bool) error {
	fd := 0
	if p := t.fw.NetNS(); p != "" {
		var err error
		if fd, err = netns.Open(p); err != nil {
			return err
		}
		defer unix.Close(fd)
	}
	c, err := netconf.Dial(fd)
	if err != nil {
		return err
	}
	defer c.Close()
	v := uint32(0)
	if on {
		v = 1
	}
	err = netconf.SetLinkNamed(c, hostIf, []netconf.Value{{Conf: netconf.ConfRouteLocalnet, Value: v}})
	if err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("ports: route_localnet of %s: %w", hostIf, err)
	}
	return nil
}
