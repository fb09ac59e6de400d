package phases

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/phasegate/phasegate/network/slot"
)

func TestEgressConfig(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"defaults", func(c *Config) {}, ""},
		{"proxy port allowed", func(c *Config) { c.Egress.ProxyPort = 3128; c.Firewall.HostTCPPorts = []uint16{3128} }, ""},
		{"proxy port not in the host ports", func(c *Config) { c.Egress.ProxyPort = 3128 }, "--slot-egress-proxy-port 3128 is not in --slot-host-tcp-ports"},
		{"IPv6 always-allowed", func(c *Config) { c.Egress.AlwaysAllow = []netip.Prefix{netip.MustParsePrefix("fd00::/8")} }, "not an IPv4 CIDR"},
		{"guest overlapping the slot CIDR", func(c *Config) {
			c.Slots.CIDR = netip.MustParsePrefix("169.254.0.0/17")
			c.Slots.Guest = slot.Guest{Tap: "tap0", Addr: netip.MustParsePrefix("169.254.0.21/30"), Gateway: netip.MustParseAddr("169.254.0.22")}
		}, "overlaps the guest range"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			c.StateDir = t.TempDir()
			tc.edit(&c)
			err := c.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("error %v, want one saying %q", err, tc.want)
			}
		})
	}
}

// The egress defaults deny the configured sets, the slot CIDR and the
// host's own addresses: those the host check read when it ran, and
// otherwise (an upgrade's new image does not check the host) a read of
// the host's, which holds loopback's and none in the slot CIDR.
func TestEgressDefaults(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Egress.AlwaysDeny = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}
	checked := []netip.Prefix{netip.MustParsePrefix("198.51.100.7/32")}
	t.Run("read by the host check", func(t *testing.T) {
		d, err := egressDefaults(cfg, checked, true)
		if err != nil {
			t.Fatal(err)
		}
		want := append(append(slices.Clone(cfg.Egress.AlwaysDeny), cfg.Slots.CIDR), checked...)
		if !slices.Equal(d.AlwaysDeny, want) {
			t.Errorf("AlwaysDeny = %v, want %v", d.AlwaysDeny, want)
		}
	})
	t.Run("read here", func(t *testing.T) {
		d, err := egressDefaults(cfg, nil, false)
		if err != nil {
			t.Fatal(err)
		}
		head := append(slices.Clone(cfg.Egress.AlwaysDeny), cfg.Slots.CIDR)
		if !slices.Equal(d.AlwaysDeny[:len(head)], head) {
			t.Fatalf("AlwaysDeny = %v, want it to start with %v", d.AlwaysDeny, head)
		}
		host := d.AlwaysDeny[len(head):]
		if !slices.Contains(host, netip.MustParsePrefix("127.0.0.1/32")) || slices.Contains(host, checked[0]) {
			t.Errorf("host addresses %v: want loopback's, read from the host", host)
		}
		for _, p := range host {
			if cfg.Slots.CIDR.Contains(p.Addr()) {
				t.Errorf("host address %v in the slot CIDR %v (denied whole already)", p, cfg.Slots.CIDR)
			}
		}
	})
}
