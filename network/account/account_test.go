package account_test

import (
	"context"
	"net"
	"net/netip"
	"testing"

	"github.com/phasegate/phasegate/network/account"
	"github.com/phasegate/phasegate/network/internal/fakehost"
	"github.com/phasegate/phasegate/network/internal/nettest"
)

func TestParseNetDev(t *testing.T) {
	in := []byte(`Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo: 38941485  556227    0    0    0     0          0         0 38941485  556227    0    0    0     0       0          0
pg-h123456789012:       0       0    0    0    0     0          0         0        0       0    0    0    0     0       0          0
  eth0:1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16
  short: 1 2 3
`)
	d, err := account.ParseNetDev(in)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := d.Names(), []string{"lo", "pg-h123456789012", "eth0", "short"}; len(got) != len(want) || got[0] != want[0] || got[2] != want[2] {
		t.Errorf("Names = %q, want %q", got, want)
	}
	for _, tc := range []struct {
		name  string
		want  account.Counts
		found bool
		fails bool
	}{
		{"eth0", account.Counts{BytesOut: 1, PacketsOut: 2, BytesIn: 9, PacketsIn: 10}, true, false},
		{"lo", account.Counts{BytesOut: 38941485, PacketsOut: 556227, BytesIn: 38941485, PacketsIn: 556227}, true, false},
		{"pg-h123456789012", account.Counts{}, true, false},
		{"absent", account.Counts{}, false, false},
		{"short", account.Counts{}, false, true},
	} {
		got, found, err := d.Counts(tc.name)
		if got != tc.want || found != tc.found || (err != nil) != tc.fails {
			t.Errorf("Counts(%s) = %+v, %t, %v; want %+v, %t, error %t", tc.name, got, found, err, tc.want, tc.found, tc.fails)
		}
	}
	if _, err := account.ParseNetDev([]byte("a\nb\nno colon here\n")); err == nil {
		t.Errorf("a line without a colon was taken")
	}
}

// TestLedgerNeverGoesBack follows a lease through a link made again and
// a policy written again: its totals only grow.
func TestLedgerNeverGoesBack(t *testing.T) {
	// The warm slot's link counted a packet of its own before the lease.
	l := account.Ledger{Start: account.Counts{BytesOut: 90, PacketsOut: 1}}
	first := account.Counts{BytesIn: 1000, PacketsIn: 10, BytesOut: 590, PacketsOut: 6}
	if u := l.Usage(first, 3); u.Counts != first.Minus(l.Start) || u.Dropped != 3 || u.BytesOut != 500 {
		t.Fatalf("first link: %+v", u)
	}
	l = l.Relinked(first).Repoliced(3)
	second := account.Counts{BytesIn: 100, PacketsIn: 1}
	u := l.Usage(second, 0)
	want := account.Usage{Counts: account.Counts{BytesIn: 1100, PacketsIn: 11, BytesOut: 500, PacketsOut: 5}, Dropped: 3}
	if u != want {
		t.Errorf("after a new link and policy: %+v, want %+v", u, want)
	}
}

// TestLinkCountsWhatCrossesIt sends datagrams into a real slot, smaller
// ones back, and reads its host link's counters both ways.
func TestLinkCountsWhatCrossesIt(t *testing.T) {
	e := nettest.New(t, 1)
	m := e.Manager(t)
	s, err := m.Create(context.Background(), 1)
	if err != nil {
		t.Fatal(err)
	}
	before, err := account.OfLink(s.HostIfIndex)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := fakehost.ListenUDP(s.NetnsPath, netip.AddrPortFrom(s.InsideAddr.Addr(), 0))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.DialUDP("udp4", nil, ln.LocalAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Unequal each way, so that a swap of In and Out shows.
	const n, size, reply = 20, 1000, 100
	payload := make([]byte, size)
	buf := make([]byte, 2*size)
	for range n {
		if _, err := c.Write(payload); err != nil {
			t.Fatal(err)
		}
		_, from, err := ln.ReadFrom(buf)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ln.WriteTo(payload[:reply], from); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Read(buf); err != nil {
			t.Fatal(err)
		}
	}
	after, err := account.OfLink(s.HostIfIndex)
	if err != nil {
		t.Fatal(err)
	}
	in, out := after.BytesIn-before.BytesIn, after.BytesOut-before.BytesOut
	if after.PacketsIn-before.PacketsIn < n || in < n*size || after.PacketsOut-before.PacketsOut < n || out < n*reply || out >= n*size {
		t.Errorf("%d datagrams of %d bytes in, of %d out: counted in %d bytes %d packets, out %d bytes %d packets",
			n, size, reply, in, after.PacketsIn-before.PacketsIn, out, after.PacketsOut-before.PacketsOut)
	}
	d, err := account.ReadNetDev()
	if err != nil {
		t.Fatal(err)
	}
	listed, ok, err := d.Counts(s.HostIf)
	if err != nil || !ok || listed.BytesIn < after.BytesIn || listed.BytesOut < after.BytesOut {
		t.Errorf("/proc/net/dev's %s: %+v, %t, %v; netlink's a moment before: %+v", s.HostIf, listed, ok, err, after)
	}
}
