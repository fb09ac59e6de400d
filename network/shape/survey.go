package shape

import (
	"context"
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
)

// found is what holds a link's limits in the kernel: the root tbfs of its
// host end and of its ifb (nil: none), and whether the host end's ingress
// redirects to that ifb.
type found struct {
	in, out  *netlink.Tbf
	redirect bool
}

// Survey reads the limits set on link now: a direction is shaped when its
// tbf is there (out of the slot: and the host end redirects to the ifb).
// The bursts are the kernel's, rounded to its ticks.
func Survey(ctx context.Context, link Link) (Limits, error) {
	f, err := survey(ctx, link)
	if err != nil {
		return Limits{}, err
	}
	var l Limits
	if f.in != nil {
		l.IngressRate, l.IngressBurst = f.in.Rate*8, uint64(netlink.Xmitsize(f.in.Rate, f.in.Buffer))*8
	}
	if f.out != nil && f.redirect {
		l.EgressRate, l.EgressBurst = f.out.Rate*8, uint64(netlink.Xmitsize(f.out.Rate, f.out.Buffer))*8
	}
	return l, nil
}

// Repair makes link hold want (with its defaults; zero: no limit) if it
// does not, and reports whether it had to: a qdisc, the redirect or the
// ifb deleted from outside, or a limit changed there.
func Repair(ctx context.Context, link Link, want Limits) (bool, error) {
	f, err := survey(ctx, link)
	if err != nil {
		return false, err
	}
	if f.holds(link, want) {
		return false, nil
	}
	if want.IsZero() {
		return true, Clear(ctx, link)
	}
	return true, Apply(ctx, link, want)
}

// holds reports whether f is what Apply writes for want.
func (f found) holds(link Link, want Limits) bool {
	same := func(q *netlink.Tbf, rate, burst uint64) bool {
		if rate == 0 {
			return q == nil
		}
		w := tbfOf(0, rate, burst)
		return q != nil && q.Rate == w.Rate && q.Buffer == w.Buffer && q.Limit == w.Limit
	}
	return same(f.in, want.IngressRate, want.IngressBurst) &&
		same(f.out, want.EgressRate, want.EgressBurst) && f.redirect == (want.EgressRate > 0)
}

func survey(ctx context.Context, link Link) (found, error) {
	if err := ctx.Err(); err != nil {
		return found{}, err
	}
	host, err := hostLink(link.Host)
	if err != nil {
		return found{}, err
	}
	var f found
	if f.in, err = rootTbf(host); err != nil {
		return found{}, err
	}
	ifb, err := netlink.LinkByName(link.Ifb)
	var nf netlink.LinkNotFoundError
	switch {
	case errors.As(err, &nf):
		return f, nil
	case err != nil:
		return found{}, fmt.Errorf("shape: %s: get link: %w", link.Ifb, err)
	}
	if f.out, err = rootTbf(ifb); err != nil {
		return found{}, err
	}
	f.redirect, err = redirects(host, ifb.Attrs().Index)
	return f, err
}

// rootTbf is l's root tbf, nil if its root is anything else.
func rootTbf(l netlink.Link) (*netlink.Tbf, error) {
	qs, err := netlink.QdiscList(l)
	if err != nil {
		return nil, fmt.Errorf("shape: %s: list qdiscs: %w", l.Attrs().Name, err)
	}
	for _, q := range qs {
		if t, ok := q.(*netlink.Tbf); ok && t.Parent == netlink.HANDLE_ROOT {
			return t, nil
		}
	}
	return nil, nil
}
