package hostwatch

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	mnl "github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Options configure [Watch].
type Options struct {
	// Ours reports whether the link called name is the caller's own: its
	// changes, and those of its addresses and routes, are left out.
	Ours func(name string) bool
	// Settle is how long the host must be still after a change before it
	// is reported: a link comes with its address and routes, a VPN with
	// several. Default 1 s.
	Settle time.Duration
	// Every bounds how often a change is reported, however busy the host:
	// at most once per Every. Default 10 s.
	Every time.Duration
}

func (o Options) withDefaults() Options {
	if o.Settle <= 0 {
		o.Settle = time.Second
	}
	if o.Every <= 0 {
		o.Every = 10 * time.Second
	}
	if o.Ours == nil {
		o.Ours = func(string) bool { return false }
	}
	return o
}

// readBuffer is the socket's receive buffer: room for tens of thousands
// of notifications between two reads.
const readBuffer = 4 << 20

// The rtnetlink groups Watch joins (linux/rtnetlink.h).
var groups = []uint32{unix.RTNLGRP_LINK, unix.RTNLGRP_IPV4_IFADDR, unix.RTNLGRP_IPV4_ROUTE}

// Watch calls changed, from the goroutine that called Watch, once after
// each burst of changes to the host's links, IPv4 addresses and IPv4
// routes that are not the caller's own, until ctx ends; it then returns
// nil. A socket that overflowed (the kernel dropped notifications) counts
// as a change. Its errors are those of opening the socket.
func Watch(ctx context.Context, o Options, changed func(ctx context.Context)) error {
	o = o.withDefaults()
	c, err := mnl.Dial(unix.NETLINK_ROUTE, nil)
	if err != nil {
		return fmt.Errorf("hostwatch: dial rtnetlink: %w", err)
	}
	defer c.Close()
	// A host making slots by the thousand sends a notification for each
	// link, address and route, all of them ours: a buffer that overflows
	// is a change reported for nothing (and a read of the host).
	_ = c.SetReadBuffer(readBuffer)
	for _, g := range groups {
		if err := c.JoinGroup(g); err != nil {
			return fmt.Errorf("hostwatch: join rtnetlink group %d: %w", g, err)
		}
	}
	names, err := newNamer()
	if err != nil {
		return err
	}
	defer names.close()
	events := make(chan struct{}, 1)
	done := make(chan struct{})
	go func() { // owned: it ends when c is closed, below, and Watch waits for it
		defer close(done)
		receive(c, names, o.Ours, events)
	}()
	defer func() {
		_ = c.Close()
		<-done
	}()
	return settle(ctx, o, events, changed)
}

// settle calls changed once events have been quiet for o.Settle, and not
// more often than o.Every, until ctx ends.
func settle(ctx context.Context, o Options, events <-chan struct{}, changed func(ctx context.Context)) error {
	var quiet <-chan time.Time
	last := time.Time{}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-events:
			wait := o.Settle
			if next := last.Add(o.Every); time.Until(next) > wait {
				wait = time.Until(next)
			}
			quiet = time.After(wait)
		case <-quiet:
			quiet, last = nil, time.Now()
			changed(ctx)
		}
	}
}

// receive reads notifications until c is closed, signalling events (a
// 1-slot channel: a burst is one signal) for each that is not ours.
func receive(c *mnl.Conn, names *namer, ours func(string) bool, events chan<- struct{}) {
	signal := func() {
		select {
		case events <- struct{}{}:
		default:
		}
	}
	for {
		msgs, err := c.Receive()
		switch {
		case errors.Is(err, unix.ENOBUFS):
			signal() // notifications were dropped: something changed
			continue
		case err != nil:
			return // closed
		}
		for _, m := range msgs {
			if !names.oursMessage(m, ours) {
				signal()
			}
		}
	}
}

// oursMessage reports whether notification m is about one of the
// caller's own links.
func (n *namer) oursMessage(m mnl.Message, ours func(string) bool) bool {
	switch m.Header.Type {
	case unix.RTM_NEWLINK, unix.RTM_DELLINK:
		index, name, ok := parseLink(m.Data)
		if !ok {
			return false
		}
		if m.Header.Type == unix.RTM_DELLINK {
			n.forget(index)
		} else {
			n.remember(index, name)
		}
		return ours(name)
	case unix.RTM_NEWADDR, unix.RTM_DELADDR:
		if len(m.Data) < unix.SizeofIfAddrmsg {
			return false
		}
		return n.ours(int32(binary.NativeEndian.Uint32(m.Data[4:8])), ours)
	case unix.RTM_NEWROUTE, unix.RTM_DELROUTE:
		oif, ok := parseRouteOIF(m.Data)
		return ok && n.ours(oif, ours)
	}
	return false
}

// parseLink reads an ifinfomsg's index and IFLA_IFNAME.
func parseLink(b []byte) (index int32, name string, ok bool) {
	if len(b) < unix.SizeofIfInfomsg {
		return 0, "", false
	}
	index = int32(binary.NativeEndian.Uint32(b[4:8]))
	ad, err := mnl.NewAttributeDecoder(b[unix.SizeofIfInfomsg:])
	if err != nil {
		return 0, "", false
	}
	for ad.Next() {
		if ad.Type() == unix.IFLA_IFNAME {
			return index, ad.String(), true
		}
	}
	return index, "", false
}

// parseRouteOIF reads an rtmsg's RTA_OIF: the route's device.
func parseRouteOIF(b []byte) (int32, bool) {
	if len(b) < unix.SizeofRtMsg {
		return 0, false
	}
	ad, err := mnl.NewAttributeDecoder(b[unix.SizeofRtMsg:])
	if err != nil {
		return 0, false
	}
	for ad.Next() {
		if ad.Type() == unix.RTA_OIF {
			return int32(ad.Uint32()), true
		}
	}
	return 0, false
}
