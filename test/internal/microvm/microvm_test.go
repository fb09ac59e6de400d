package microvm

import (
	"context"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The kernel command line is init's only input: every field of Config it
// reads must be there, in the words init parses.
func TestCmdline(t *testing.T) {
	base := Config{
		Addr: netip.MustParsePrefix("169.254.0.21/30"), Gateway: netip.MustParseAddr("169.254.0.22"), Port: 7000,
	}
	withProbes := base
	withProbes.Probes = []netip.AddrPort{netip.MustParseAddrPort("198.51.100.2:7001"), netip.MustParseAddrPort("203.0.113.2:7001")}
	withHold := base
	withHold.Hold = netip.MustParseAddrPort("198.51.100.2:7002")
	for _, tc := range []struct {
		name string
		cfg  Config
		want []string
		not  []string
	}{
		{"bare", base, []string{"console=ttyS0", "panic=-1", "pg.addr=169.254.0.21/30", "pg.gw=169.254.0.22", "pg.port=7000"}, []string{"pg.probe=", "pg.hold="}},
		{"probes", withProbes, []string{"pg.probe=198.51.100.2:7001,203.0.113.2:7001"}, []string{"pg.hold="}},
		{"hold", withHold, []string{"pg.hold=198.51.100.2:7002"}, []string{"pg.probe="}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			words := strings.Fields(tc.cfg.cmdline())
			for _, w := range tc.want {
				if !containsWord(words, w) {
					t.Errorf("cmdline %q lacks %q", words, w)
				}
			}
			for _, w := range tc.not {
				for _, got := range words {
					if strings.HasPrefix(got, w) {
						t.Errorf("cmdline %q has %q", words, got)
					}
				}
			}
		})
	}
}

func containsWord(words []string, w string) bool {
	for _, x := range words {
		if x == w {
			return true
		}
	}
	return false
}

// An incomplete Config is refused before any process starts.
func TestStartRefusesIncompleteConfig(t *testing.T) {
	full := Config{
		Netns: "/proc/self/ns/net", Tap: "tap0", MAC: net.HardwareAddr{0x52, 0x54, 0, 0, 0, 0x15},
		Addr: netip.MustParsePrefix("169.254.0.21/30"), Gateway: netip.MustParseAddr("169.254.0.22"),
		Port: 7000, Console: "/dev/null",
	}
	for _, tc := range []struct {
		name  string
		spoil func(*Config)
	}{
		{"no namespace", func(c *Config) { c.Netns = "" }},
		{"no tap", func(c *Config) { c.Tap = "" }},
		{"no MAC", func(c *Config) { c.MAC = nil }},
		{"no address", func(c *Config) { c.Addr = netip.Prefix{} }},
		{"no gateway", func(c *Config) { c.Gateway = netip.Addr{} }},
		{"no port", func(c *Config) { c.Port = 0 }},
		{"no console", func(c *Config) { c.Console = "" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := full
			tc.spoil(&c)
			if vm, err := Start(context.Background(), Guest{Kernel: "/nonexistent", Initrd: "/nonexistent"}, c); err == nil {
				_ = vm.Stop(0)
				t.Fatal("Start accepted an incomplete config")
			}
		})
	}
}

// A guest directory without a built guest is an error that says what is
// missing and how to make it, for the test to fail with.
func TestLocateSaysWhyNot(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "vmlinuz"), []byte("k"), 0o644); err != nil {
		t.Fatal(err)
	}
	empty := t.TempDir()
	if err := os.WriteFile(filepath.Join(empty, "vmlinuz"), []byte("k"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(empty, "initrd.img"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, dir, want string
	}{
		{"nothing built", t.TempDir(), "vmlinuz"},
		{"no initramfs", dir, "initrd.img"},
		{"empty initramfs", empty, "initrd.img is empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("PHASEGATE_GUEST", tc.dir)
			_, err := Locate(context.Background(), "/nonexistent")
			if err == nil || !strings.Contains(err.Error(), "cannot run the guest") || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Locate(%s) = %v, want an error naming %q", tc.dir, err, tc.want)
			}
		})
	}
}
