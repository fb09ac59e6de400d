package test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
)

// A daemon with --slot-cidr6 hands out dual-stack slots: Acquire answers
// each slot's /127 beside its /31, the slot has that address and an IPv6
// default route via its host end, a lease's egress policy takes IPv6
// CIDRs (a malformed one is refused), and a SIGTERM and start restore the
// lease with its IPv6 as it was.
func TestDualStackDaemon(t *testing.T) {
	h := newHost(t)
	cidr6 := randomULA()
	d := start(t, nil, h.args(freePort(t), "--slots=16", "--slot-cidr6="+cidr6.String())...)
	d.waitServing(time.Minute)
	c := d.slots()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	resp, err := c.Acquire(ctx, &phasegatev1.AcquireRequest{Owner: "v6", RequestId: "v6-1",
		EgressPolicy: &phasegatev1.EgressPolicy{Deny: []string{"2001:db8:1::/48", "192.0.2.0/24"}}})
	if err != nil {
		t.Fatalf("Acquire with an IPv6 CIDR in its policy: %v", err)
	}
	s := resp.GetSlot()
	host6, inside6 := netip.MustParsePrefix(s.GetHostAddress6()), netip.MustParsePrefix(s.GetInsideAddress6())
	if !cidr6.Contains(inside6.Addr()) || inside6.Bits() != 127 || host6.Addr().Next() != inside6.Addr() {
		t.Fatalf("slot %d: host_address6 %q, inside_address6 %q; want a /127 of %s", s.GetIndex(), s.GetHostAddress6(), s.GetInsideAddress6(), cidr6)
	}
	if got := s.GetEgressPolicy().GetDeny(); strings.Join(got, ",") != "192.0.2.0/24,2001:db8:1::/48" {
		t.Errorf("the lease's deny list %v, want both families, IPv4 first", got)
	}
	ns := "--net=" + s.GetNetnsPath()
	if out := run(t, "nsenter", ns, "ip", "-6", "-o", "addr", "show", "dev", s.GetInsideInterface()); !strings.Contains(out, inside6.String()) {
		t.Errorf("inside %s has %q, want %s", s.GetInsideInterface(), out, inside6)
	}
	if out := run(t, "nsenter", ns, "ip", "-6", "route", "show", "default"); !strings.Contains(out, "via "+host6.Addr().String()) {
		t.Errorf("IPv6 default route inside %q, want via %s", out, host6.Addr())
	}
	if out := run(t, "ip", "-6", "-o", "addr", "show", "dev", s.GetHostInterface()); !strings.Contains(out, host6.String()) {
		t.Errorf("host end %s has %q, want %s", s.GetHostInterface(), out, host6)
	}

	_, err = c.SetEgressPolicy(ctx, &phasegatev1.SetEgressPolicyRequest{Index: s.GetIndex(), LeaseId: resp.GetLeaseId(),
		EgressPolicy: &phasegatev1.EgressPolicy{Allow: []string{"fd00:::1/64"}}})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("a malformed IPv6 CIDR: %v, want InvalidArgument", err)
	}
	d.signal(syscall.SIGTERM)
	if code := d.wait(time.Minute); code != 0 {
		t.Fatalf("exit %d after SIGTERM:\n%s", code, d.Output())
	}

	// A restart restores the lease with its IPv6 as it was.
	d = start(t, nil, h.args(freePort(t), "--slots=16", "--slot-cidr6="+cidr6.String())...)
	d.waitServing(time.Minute)
	c = d.slots()
	got, err := c.Get(ctx, &phasegatev1.GetRequest{Index: s.GetIndex()})
	if err != nil || got.GetSlot().GetInsideAddress6() != s.GetInsideAddress6() || got.GetSlot().GetOwner() != "v6" {
		t.Fatalf("Get after the restart = %v, %v; want the lease with %s", got, err, s.GetInsideAddress6())
	}
	if out := run(t, "nsenter", ns, "ip", "-6", "-o", "addr", "show", "dev", s.GetInsideInterface()); !strings.Contains(out, inside6.String()) {
		t.Errorf("after the restart inside %s has %q, want %s", s.GetInsideInterface(), out, inside6)
	}
	if _, err := c.Release(ctx, &phasegatev1.ReleaseRequest{Index: s.GetIndex(), LeaseId: resp.GetLeaseId()}); err != nil {
		t.Fatal(err)
	}
	d.signal(syscall.SIGTERM)
	if code := d.wait(time.Minute); code != 0 {
		t.Errorf("exit %d after SIGTERM:\n%s", code, d.Output())
	}
}

// A --slot-cidr6 that overlaps an address of the host not the daemon's own
// slots' is refused at start: exit 2, in one line naming the flag and
// what overlaps it, before anything is made.
func TestDualStackCIDR6InUseExitsTwo(t *testing.T) {
	h := newHost(t)
	cidr6 := randomULA()
	link := h.prefix + "h0" // no slot's (index 0); the sweep removes it
	run(t, "ip", "link", "add", link, "type", "veth", "peer", "name", link+"0")
	run(t, "ip", "-6", "addr", "add", netip.PrefixFrom(cidr6.Addr().Next(), 64).String(), "dev", link, "nodad")
	d := start(t, nil, h.args(freePort(t), "--slots=16", "--slot-cidr6="+cidr6.String())...)
	if code := d.wait(time.Minute); code != 2 || !strings.Contains(d.Output(), "--slot-cidr6 "+cidr6.String()) || !strings.Contains(d.Output(), link) {
		t.Errorf("exit %d, want 2 naming --slot-cidr6 %s and %s:\n%s", code, cidr6, link, d.Output())
	}
}

// randomULA is a /64 of the unique local range (fd00::/8, 56 random bits)
// for a test's --slot-cidr6.
func randomULA() netip.Prefix {
	return netip.MustParsePrefix(fmt.Sprintf("fd%02x:%x:%x:%x::/64", rand.IntN(256), rand.IntN(1<<16), rand.IntN(1<<16), rand.IntN(1<<16)))
}
