package account

import (
	"bytes"
	"errors"
	"fmt"
	"math"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/network/internal/procfs"
)

// Counts are the bytes and packets a slot's host link carried: In into
// the slot (the host end's transmit), Out from it (the host end's
// receive).
type Counts struct {
	BytesIn, PacketsIn   uint64
	BytesOut, PacketsOut uint64
}

// Plus returns c and d added.
func (c Counts) Plus(d Counts) Counts {
	return Counts{BytesIn: c.BytesIn + d.BytesIn, PacketsIn: c.PacketsIn + d.PacketsIn,
		BytesOut: c.BytesOut + d.BytesOut, PacketsOut: c.PacketsOut + d.PacketsOut}
}

// Minus returns c less d, each count at least 0: what a link counted
// since it counted d.
func (c Counts) Minus(d Counts) Counts {
	sub := func(a, b uint64) uint64 { return a - min(a, b) }
	return Counts{BytesIn: sub(c.BytesIn, d.BytesIn), PacketsIn: sub(c.PacketsIn, d.PacketsIn),
		BytesOut: sub(c.BytesOut, d.BytesOut), PacketsOut: sub(c.PacketsOut, d.PacketsOut)}
}

// Usage is a lease's totals: what its slot's links carried, and the
// packets its egress policies dropped on the host.
type Usage struct {
	Counts
	// Dropped counts the packets the lease's egress policies dropped on
	// the host, over every policy the lease had.
	Dropped uint64
}

// Ledger is what a lease's totals are made of besides what its current
// link and egress policy count now ([Ledger.Usage]): what its earlier
// links and policies counted, and where its current link's counters
// stood when the lease began on it (a warm slot's link may have counted
// a few packets of its own before).
type Ledger struct {
	// Carried is what earlier links and policies counted.
	Carried Usage
	// Start is the current link's counters when the lease began on it.
	Start Counts
}

// Usage is the lease's totals with link its current link's counters and
// dropped its current policy's host drops.
func (l Ledger) Usage(link Counts, dropped uint64) Usage {
	return Usage{Counts: l.Carried.Counts.Plus(link.Minus(l.Start)), Dropped: l.Carried.Dropped + dropped}
}

// Relinked is l after the lease's link was made again, the old one having
// counted last when last seen; the new link counts from 0.
func (l Ledger) Relinked(last Counts) Ledger {
	l.Carried.Counts = l.Carried.Counts.Plus(last.Minus(l.Start))
	l.Start = Counts{}
	return l
}

// Repoliced is l after the lease's egress policy was written again, the
// old one having dropped dropped packets on the host.
func (l Ledger) Repoliced(dropped uint64) Ledger {
	l.Carried.Dropped += dropped
	return l
}

// ErrNoLink is wrapped by [OfLink] for a link that is gone: a container's
// namespace that went took its pair, the slot's host end with it.
var ErrNoLink = errors.New("no such link")

// OfLink reads the counters of the host link ifindex, in the caller's
// network namespace.
func OfLink(ifindex int) (Counts, error) {
	l, err := netlink.LinkByIndex(ifindex)
	var nf netlink.LinkNotFoundError
	if errors.As(err, &nf) || errors.Is(err, unix.ENODEV) {
		return Counts{}, fmt.Errorf("account: link %d: %w", ifindex, ErrNoLink)
	}
	if err != nil {
		return Counts{}, fmt.Errorf("account: link %d: RTM_GETLINK: %w", ifindex, err)
	}
	s := l.Attrs().Statistics
	if s == nil {
		return Counts{}, fmt.Errorf("account: link %d (%s): the kernel gave no counters", ifindex, l.Attrs().Name)
	}
	return Counts{BytesIn: s.TxBytes, PacketsIn: s.TxPackets, BytesOut: s.RxBytes, PacketsOut: s.RxPackets}, nil
}

// NetDev is /proc/net/dev as read once: each link's name, in the
// kernel's order, and its counters, parsed only when asked for (a
// listing of names, the reconciler's, reads none of them).
type NetDev struct {
	names    []string
	counters [][]byte // the text after "<name>:", by position
	at       map[string]int
}

// ReadNetDev reads /proc/thread-self/net/dev: the links of the calling
// thread's network namespace.
func ReadNetDev() (*NetDev, error) {
	b, err := procfs.ReadFile("/proc/thread-self/net/dev")
	if err != nil {
		return nil, fmt.Errorf("account: %w", err)
	}
	return ParseNetDev(b)
}

// ParseNetDev parses /proc/net/dev: two header lines, then one line per
// link, "<spaces><name>: <counters>". A name holds neither ':' nor
// spaces.
func ParseNetDev(b []byte) (*NetDev, error) {
	n := bytes.Count(b, []byte{'\n'})
	d := &NetDev{names: make([]string, 0, n), counters: make([][]byte, 0, n)}
	for n := 0; len(b) > 0; n++ {
		var line []byte
		line, b, _ = bytes.Cut(b, []byte{'\n'})
		if n < 2 || len(line) == 0 {
			continue // headers
		}
		name, rest, ok := bytes.Cut(line, []byte{':'})
		name = bytes.TrimSpace(name)
		if !ok || len(name) == 0 {
			return nil, fmt.Errorf("account: malformed /proc/net/dev line %q", line)
		}
		d.names = append(d.names, string(name))
		d.counters = append(d.counters, rest)
	}
	return d, nil
}

// Names are the links' names, in the kernel's order.
func (d *NetDev) Names() []string { return d.names }

// The columns of a /proc/net/dev line after "<name>:": receive bytes,
// packets and six more, then transmit bytes and packets.
const (
	colRxBytes   = 0
	colRxPackets = 1
	colTxBytes   = 8
	colTxPackets = 9
)

// Counts returns the counters of the link called name; ok is false when
// there is no such link. It is not safe for concurrent use.
func (d *NetDev) Counts(name string) (c Counts, ok bool, err error) {
	if d.at == nil {
		d.at = make(map[string]int, len(d.names))
		for i, n := range d.names {
			d.at[n] = i
		}
	}
	i, ok := d.at[name]
	if !ok {
		return Counts{}, false, nil
	}
	// The columns read, parsed in place: a reconcile pass reads every
	// lease's, and bytes.Fields with strconv would allocate per column.
	var v [colTxPackets + 1]uint64
	rest := d.counters[i]
	for col := range v {
		rest = bytes.TrimLeft(rest, " ")
		end := bytes.IndexByte(rest, ' ')
		if end < 0 {
			end = len(rest)
		}
		if end == 0 {
			return Counts{}, false, fmt.Errorf("account: /proc/net/dev: link %s: %d counters, want at least %d", name, col, len(v))
		}
		for _, b := range rest[:end] {
			if b < '0' || b > '9' || v[col] > (math.MaxUint64-9)/10 {
				return Counts{}, false, fmt.Errorf("account: /proc/net/dev: link %s: counter %d is not a count: %q", name, col+1, rest[:end])
			}
			v[col] = v[col]*10 + uint64(b-'0')
		}
		rest = rest[end:]
	}
	return Counts{BytesIn: v[colTxBytes], PacketsIn: v[colTxPackets], BytesOut: v[colRxBytes], PacketsOut: v[colRxPackets]}, true, nil
}
