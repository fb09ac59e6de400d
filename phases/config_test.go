package phases

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestConfigValidate(t *testing.T) {
	base := t.TempDir()
	file := filepath.Join(base, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(base, "link")
	if err := os.Symlink(base, link); err != nil {
		t.Fatal(err)
	}
	open := map[string]os.FileMode{"world": 0o777, "group": 0o770, "sticky": os.ModeSticky | 0o777, "search": 0o710}
	for name, mode := range open {
		if err := os.Mkdir(filepath.Join(base, name), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(filepath.Join(base, name), mode); err != nil {
			t.Fatal(err)
		}
	}
	valid := func() Config {
		c := DefaultConfig()
		c.StateDir = filepath.Join(base, "state")
		c.Slots.NetnsDir = filepath.Join(base, "netns")
		return c
	}
	tests := []struct {
		name   string
		modify func(*Config)
		want   string // "" = valid
	}{
		{"defaults", func(*Config) {}, ""},
		{"ipv6 listen", func(c *Config) { c.Listen = "[::1]:0" }, ""},
		{"listen without port", func(c *Config) { c.Listen = "127.0.0.1" }, "--listen"},
		{"listen port out of range", func(c *Config) { c.Listen = "127.0.0.1:70000" }, "port must be a number"},
		{"listen on a name", func(c *Config) { c.Listen = "example.com:80" }, "host must be an IP address"},
		{"state dir relative", func(c *Config) { c.StateDir = "state" }, "absolute"},
		{"state dir is a file", func(c *Config) { c.StateDir = file }, "not a directory"},
		{"state dir is a symlink", func(c *Config) { c.StateDir = link }, "symlink"},
		{"state dir world-writable", func(c *Config) { c.StateDir = filepath.Join(base, "world") }, "--state-dir " + filepath.Join(base, "world") + " is writable by others: owner "},
		{"state dir group-writable", func(c *Config) { c.StateDir = filepath.Join(base, "group") }, "is writable by its group"},
		{"state dir in a world-writable dir", func(c *Config) { c.StateDir = filepath.Join(base, "world", "state") }, filepath.Join(base, "world") + " above it is writable by others"},
		{"state dir in a sticky dir", func(c *Config) { c.StateDir = filepath.Join(base, "sticky", "state") }, ""},
		{"state dir searchable by a group (the control group's 0710)", func(c *Config) { c.StateDir = filepath.Join(base, "search") }, ""},
		{"lock dir relative", func(c *Config) { c.LockDir = "locks" }, "--lock-dir \"locks\" must be an absolute path"},
		{"lock dir sticky and world-writable, as /run/lock", func(c *Config) { c.LockDir = filepath.Join(base, "sticky") }, "--lock-dir " + filepath.Join(base, "sticky") + " is writable by others"},
		{"lock dir is a symlink", func(c *Config) { c.LockDir = link }, "--lock-dir " + link + " is a symlink"},
		{"lock dir in a sticky dir", func(c *Config) { c.LockDir = filepath.Join(base, "sticky", "locks") }, ""},
		{"netns dir without parent", func(c *Config) { c.Slots.NetnsDir = "/nonexistent/x/netns" }, "parent directory"},
		{"netns dir is a file", func(c *Config) { c.Slots.NetnsDir = file }, "not a directory"},
		{"no slots", func(c *Config) { c.Slots.Slots = 0 }, "slots is 0"},
		{"cidr too small", func(c *Config) { c.Slots.CIDR = netip.MustParsePrefix("169.254.0.0/30") }, "169.254.0.0/30"},
		{"negative budget", func(c *Config) { c.ReclaimBudget = -time.Second }, "--reclaim-budget"},
		{"no workers", func(c *Config) { c.ReclaimWorkers = 0 }, "--reclaim-workers"},
		{"pool above slots", func(c *Config) { c.Slots.Slots = 4; c.PoolSize = 5; c.PoolMinReady = 1 }, "larger than --slots"},
		{"min ready above pool", func(c *Config) { c.PoolMinReady = 17 }, "--pool-min-ready 17"},
		{"zero grace", func(c *Config) { c.PoolGrace = 0 }, "--pool-grace"},
		{"zero stop timeout", func(c *Config) { c.StopTimeout = 0 }, "--stop-timeout"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := valid()
			tc.modify(&c)
			err := c.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("valid config rejected: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, ErrConfig) {
				t.Fatalf("err = %v, want ErrConfig containing %q", err, tc.want)
			}
		})
	}
	for _, dir := range []string{filepath.Join(base, "state"), filepath.Join(base, "world", "state"), filepath.Join(base, "sticky", "locks")} {
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Fatalf("Validate created %s", dir)
		}
	}
}
