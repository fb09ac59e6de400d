package slot

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

func TestValidate(t *testing.T) {
	good := Config{Prefix: "pg-", NetnsDir: "/run/netns", Slots: 1000, CIDR: DefaultCIDR}
	if err := good.Validate(); err != nil {
		t.Fatalf("good config: %v", err)
	}
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("default config: %v", err)
	}
	cases := []struct {
		name string
		mod  func(*Config)
		want string
	}{
		{"empty prefix", func(c *Config) { c.Prefix = "" }, "prefix is empty"},
		{"slash", func(c *Config) { c.Prefix = "a/b-" }, "prefix"},
		{"dots", func(c *Config) { c.Prefix = "..-" }, "prefix"},
		{"upper", func(c *Config) { c.Prefix = "PG-" }, "prefix"},
		{"digit end", func(c *Config) { c.Prefix = "pg1" }, "do not end with a digit"},
		{"too long", func(c *Config) { c.Prefix = "phasegate-slot-" }, "IFNAMSIZ"},
		{"too long for N", func(c *Config) { c.Prefix = "abcdefghij"; c.Slots = 100000 }, "IFNAMSIZ"},
		{"zero slots", func(c *Config) { c.Slots = 0 }, "slots is 0"},
		{"relative dir", func(c *Config) { c.NetnsDir = "run/netns" }, "not absolute"},
		{"unclean dir", func(c *Config) { c.NetnsDir = "/run/../run/netns" }, "not clean"},
		{"no cidr", func(c *Config) { c.CIDR = netip.Prefix{} }, "not set"},
		{"v6", func(c *Config) { c.CIDR = netip.MustParsePrefix("fd00::/64") }, "not IPv4"},
		{"host bits", func(c *Config) { c.CIDR = netip.MustParsePrefix("169.254.0.1/17") }, "host bits"},
		{"small", func(c *Config) { c.CIDR = netip.MustParsePrefix("169.254.0.0/24") }, "need 2000"},
		{"metadata", func(c *Config) { c.CIDR = netip.MustParsePrefix("169.254.168.0/21") }, "metadata"},
		{"guest range inside", func(c *Config) {
			c.CIDR, c.GuestRanges = netip.MustParsePrefix("169.254.0.0/17"), []netip.Prefix{E2BGuestRange}
		}, "overlaps the guest range 169.254.0.20/30"},
	}
	for _, tc := range cases {
		c := good
		tc.mod(&c)
		err := c.Validate()
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Validate() = %v, want ErrInvalidConfig mentioning %q", tc.name, err, tc.want)
		}
	}
	// The largest index must fit: "abcdefghijk" + "h" + "999" = 15 bytes.
	c := good
	c.Prefix, c.Slots = "abcdefghijk", 999
	if err := c.Validate(); err != nil {
		t.Errorf("15-byte names rejected: %v", err)
	}
	c.Slots = 1000
	if err := c.Validate(); err == nil {
		t.Errorf("16-byte names accepted")
	}
}

func TestNamesAndAddresses(t *testing.T) {
	c := Config{Prefix: "pg-", NetnsDir: "/run/netns", Slots: 300, CIDR: DefaultCIDR}
	s := c.Slot(1)
	if s.NetnsName != "pg-1" || s.NetnsPath != "/run/netns/pg-1" || s.HostIf != "pg-h1" || s.InsideIf != "eth0" {
		t.Errorf("slot 1 = %+v", s)
	}
	if s.HostAddr.String() != "169.254.128.0/31" || s.InsideAddr.String() != "169.254.128.1/31" {
		t.Errorf("slot 1 addrs = %s %s", s.HostAddr, s.InsideAddr)
	}
	s = c.Slot(200)
	if s.HostAddr.String() != "169.254.129.142/31" || s.InsideAddr.String() != "169.254.129.143/31" {
		t.Errorf("slot 200 addrs = %s %s", s.HostAddr, s.InsideAddr)
	}
	for name, want := range map[string]int{"pg-1": 1, "pg-300": 300, "pg-301": 0, "pg-0": 0, "pg-01": 0,
		"pg-abc": 0, "pg-h1": 0, "pg-1a": 0, "pg1": 0, "xpg-1": 0, "pg--1": 0, "pg-+1": 0} {
		got, ok := c.ParseNetnsName(name)
		if (want != 0) != ok || got != want {
			t.Errorf("ParseNetnsName(%q) = %d, %v; want %d", name, got, ok, want)
		}
	}
	for name, want := range map[string]int{"pg-h1": 1, "pg-h300": 300, "pg-1": 0, "pg-h": 0, "pg-h01": 0} {
		got, ok := c.ParseHostIfName(name)
		if (want != 0) != ok || got != want {
			t.Errorf("ParseHostIfName(%q) = %d, %v; want %d", name, got, ok, want)
		}
	}
	// Canonical indices beyond Slots are ours too; look-alikes are not.
	for name, want := range map[string]int{"pg-301": 301, "pg-2147483647": 2147483647, "pg-1": 1,
		"pg-2147483648": 0, "pg-0301": 0, "pg-0": 0, "pg-+301": 0, "pg- 301": 0, "pg-301 ": 0, "pg-h301": 0} {
		got, ok := c.CanonicalNetnsIndex(name)
		if (want != 0) != ok || got != want {
			t.Errorf("CanonicalNetnsIndex(%q) = %d, %v; want %d", name, got, ok, want)
		}
	}
	for name, want := range map[string]int{"pg-h301": 301, "pg-h0301": 0, "pg-301": 0} {
		got, ok := c.CanonicalHostIfIndex(name)
		if (want != 0) != ok || got != want {
			t.Errorf("CanonicalHostIfIndex(%q) = %d, %v; want %d", name, got, ok, want)
		}
	}
	// "pg-h" + 11 digits is 15 bytes; 12 digits do not fit.
	if !c.HostIfFits(99999999999) || c.HostIfFits(999999999999) || !c.HostIfFits(MaxIndex) {
		t.Errorf("HostIfFits")
	}
	long := Config{Prefix: "abcdefghijk", Slots: 999}
	if !long.HostIfFits(999) || long.HostIfFits(1000) {
		t.Errorf("HostIfFits for a 11-byte prefix")
	}
	if c.TableName() != "phasegate_pg_" {
		t.Errorf("TableName = %q", c.TableName())
	}
}

// The default slot CIDR lies clear of the addresses hosts and guests
// commonly use in link-local space, and of the guest range microVM slots
// will add: a default configuration with that guest range is valid.
func TestDefaultCIDRIsClear(t *testing.T) {
	for _, used := range []string{
		"169.254.0.20/30",  // E2B's microVM guests
		"169.254.20.10/32", // Kubernetes node-local DNS
		"169.254.169.0/24", // cloud metadata, DNS (.253), time (.123)
		"169.254.170.2/32", // ECS task metadata
		"169.254.172.0/22", // EKS
		"169.254.0.0/17",   // the network tests' playgrounds (nettest)
	} {
		if p := netip.MustParsePrefix(used); p.Overlaps(DefaultCIDR) {
			t.Errorf("DefaultCIDR %s overlaps %s", DefaultCIDR, p)
		}
	}
	c := DefaultConfig()
	c.GuestRanges = []netip.Prefix{E2BGuestRange}
	if err := c.Validate(); err != nil {
		t.Errorf("the defaults with E2B's guest range: %v", err)
	}
}
