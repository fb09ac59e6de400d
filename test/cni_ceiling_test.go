package test

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
)

// A network's egress policy is a ceiling: the runtime's "egress"
// capability args narrow it for a container, never widen it, unless the
// conflist says "egressCapability": "replace". The attack, a
// deny-all network and capability args allowing 0.0.0.0/1 and
// 128.0.0.0/1, leaves the container denied everything; under a network
// that only keeps the daemon's always-denied set, the same args reach
// none of it (the outside's reflector, in TEST-NET-1, and the metadata
// address, both served by the test's own outside namespace). Narrowing
// works: a container allowed one of the network's two ranges reaches that
// one and not the other, beside one without args reaching both; and the
// conflist that opts in by name lets the container's policy replace the
// network's deny-all.
func TestCNICapabilityCannotLiftTheNetworksPolicy(t *testing.T) {
	nd := newNode(t)
	o := newOutside(t, nd)
	second := netip.AddrPortFrom(netip.MustParseAddr("198.51.100.9"), 7100) // TEST-NET-2: always denied too
	run(t, "nsenter", "--net="+o.ns, "--", "ip", "addr", "add", second.Addr().String()+"/32", "dev", "eth0")
	o.echo(t, second)
	metadata := netip.AddrPortFrom(metadataAddr, 80)
	pub := newPublicDir(t)
	h, d, _ := slotsInNode(t, nd, nil, nil, nil)
	c := d.slots()
	withCap := func(extra map[string]any) map[string]any {
		extra["capabilities"] = map[string]any{"egress": true}
		return extra
	}
	everything := `CAP_ARGS={"egress":{"allow":["0.0.0.0/1","128.0.0.0/1"]}}`
	onlyFirst := `CAP_ARGS={"egress":{"allow":["192.0.2.0/24"]}}`
	onlySecond := `CAP_ARGS={"egress":{"allow":["198.51.100.0/24"]}}`
	nets := map[string]*cniNet{
		"denyAll": newCNINet(t, h.prefix+"closed", d.control, withCap(map[string]any{"egress": map[string]any{"denyAll": true}})),
		"always":  newCNINet(t, h.prefix+"always", d.control, withCap(map[string]any{"egress": map[string]any{}})),
		"wide":    newCNINet(t, h.prefix+"wide", d.control, withCap(map[string]any{"egress": map[string]any{"allow": []string{"192.0.2.0/24", "198.51.100.0/24"}}})),
		"replace": newCNINet(t, h.prefix+"replace", d.control, withCap(map[string]any{"egress": map[string]any{"denyAll": true}, "egressCapability": "replace"})),
	}
	for _, tc := range []struct {
		ctr, net, capArgs string
		allow             []string // the attachment's policy as recorded
		denyAll           bool
		reaches, not      []netip.AddrPort
	}{
		{"lifted", "denyAll", everything, nil, true, nil, []netip.AddrPort{o.reflector, second, metadata}},
		{"always", "always", everything, nil, false, nil, []netip.AddrPort{o.reflector, second, metadata}},
		{"narrowed", "wide", onlyFirst, []string{"192.0.2.0/24"}, false, []netip.AddrPort{o.reflector}, []netip.AddrPort{second, metadata}},
		{"plain", "wide", "", []string{"192.0.2.0/24", "198.51.100.0/24"}, false, []netip.AddrPort{o.reflector, second}, []netip.AddrPort{metadata}},
		{"replaced", "replace", onlySecond, []string{"198.51.100.0/24"}, false, []netip.AddrPort{second}, []netip.AddrPort{o.reflector, metadata}},
	} {
		func() {
			n := nets[tc.net]
			ctr := containerNetns(t, tc.ctr)
			var env []string
			if tc.capArgs != "" {
				env = []string{tc.capArgs}
			}
			own := netip.MustParseAddr(parseResult(t, n.mustTool("add", ctr, env...), ctr).insideAddr())
			defer n.mustTool("del", ctr, env...)
			l := attachmentIn(t, c, n.name, ctr)
			if p := l.GetEgressPolicy(); p == nil || !slices.Equal(p.GetAllow(), tc.allow) || len(p.GetDeny()) != 0 || p.GetDenyAll() != tc.denyAll {
				t.Errorf("%s: the attachment's policy: %v, want allow %v, denyAll %v", tc.ctr, p, tc.allow, tc.denyAll)
			}
			port := uint16(7300)
			send := func(to netip.AddrPort, payload string) {
				port++ // a new flow each time
				attack(t, pub.testBinary, ctr, fmt.Sprintf("udp|%s|%s|%s|5", netip.AddrPortFrom(own, port), to, payload), "")
			}
			for _, to := range tc.reaches {
				payload := fmt.Sprintf("%s to %s", tc.ctr, to)
				send(to, payload)
				if !waitSeen(o, payload) {
					t.Errorf("%s does not reach %s", tc.ctr, to)
				}
			}
			for _, to := range tc.not {
				drops := dropsOf(t, c, l.GetIndex())
				payload := fmt.Sprintf("%s to %s", tc.ctr, to)
				send(to, payload)
				// Dropped and counted on the host: what was sent is gone.
				waitFor(t, 10*time.Second, "the datagrams to "+to.String()+" counted as dropped", func() bool {
					return dropsOf(t, c, l.GetIndex()) >= drops+5
				})
				if o.saw(payload) {
					t.Errorf("%s reached %s, which the network's policy denies it", tc.ctr, to)
				}
			}
			n.mustTool("check", ctr, env...)
		}()
	}
}

// dropsOf is what lease i's egress policy dropped, as Get counts it.
func dropsOf(t *testing.T, c phasegatev1.SlotsClient, i uint32) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got, err := c.Get(ctx, &phasegatev1.GetRequest{Index: i})
	if err != nil {
		t.Fatal(err)
	}
	return got.GetSlot().GetEgressDroppedPackets()
}
