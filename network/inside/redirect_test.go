package inside_test

import (
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/phasegate/phasegate/network/egress"
	"github.com/phasegate/phasegate/network/inside"
)

// proxyPort is where the tests' egress proxy listens on the fake host,
// at the slot's gateway: the one host port the fake host's slot table
// lets slots reach.
const proxyPort = echoPort + 1

func redirect(t *testing.T, s inside.Slot) {
	t.Helper()
	p, err := egress.Parse(nil, nil, false, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := inside.ApplyPolicy(s, p, egress.Defaults{AlwaysDeny: egress.DefaultAlwaysDeny, ProxyPort: proxyPort}); err != nil {
		t.Fatal(err)
	}
}

// TestRedirectTCP: new TCP connections of the namespace's own processes
// reach the proxy instead of their destination; established ones are
// left alone.
func TestRedirectTCP(t *testing.T) {
	h, s := network(t)
	sl := h.Slots[0]
	proxyPeers := echo(t, h.Path, netip.AddrPortFrom(sl.HostAddr.Addr(), proxyPort))
	if err := inside.ApplyPolicy(s, mustPolicy(t, []string{"192.0.2.2"}, nil, false), defaults); err != nil {
		t.Fatal(err)
	}
	direct, err := dial(t, sl.NetnsPath, farA, echoPort, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	redirect(t, s)
	if err := roundTrip(direct, "established before the redirect"); err != nil {
		t.Errorf("an established connection broke: %v", err)
	}
	select {
	case p := <-proxyPeers:
		t.Fatalf("the proxy got a connection from %s before any was redirected", p)
	default:
	}
	c, err := dial(t, sl.NetnsPath, farB, echoPort, 10*time.Second)
	if err != nil {
		t.Fatalf("redirected connection: %v", err)
	}
	if err := roundTrip(c, "via the proxy"); err != nil {
		t.Fatal(err)
	}
	if got := <-proxyPeers; got != sl.InsideAddr.Addr() {
		t.Errorf("the proxy saw %s, want %s", got, sl.InsideAddr.Addr())
	}
}

func TestApplyRefusesRedirectWithoutProxy(t *testing.T) {
	_, s := network(t)
	p, err := egress.Parse(nil, nil, false, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := inside.ApplyPolicy(s, p, defaults); !errors.Is(err, egress.ErrInvalid) {
		t.Errorf("redirect without a proxy: %v, want egress.ErrInvalid", err)
	}
	if f, err := inside.Inspect(s, inside.Guest{}); err != nil || f.Fingerprint != "" {
		t.Errorf("after a refused policy: %+v, %v", f, err)
	}
}
