package netconf

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
)

// QuietIPv6 turns IPv6 off on link name of the caller's namespace, which
// must be the root one (the /proc/sys lookup there is cheap, unlike inside
// thousands of namespaces): no link-local address, no fe80::/64 and
// multicast routes, no DAD or MLD of the link's own. Address generation
// off alone leaves the multicast route. There is no netlink attribute
// for it, so the per-device sysctl is written; a kernel without IPv6 has
// nothing to turn off. Written before the link is first set up, nothing
// of IPv6 is ever made on it.
func QuietIPv6(name string) error {
	path := "/proc/sys/net/ipv6/conf/" + name + "/disable_ipv6"
	err := os.WriteFile(path, []byte("1"), 0)
	if err == nil || (errors.Is(err, fs.ErrNotExist) && !IPv6Enabled()) {
		return nil
	}
	return fmt.Errorf("turn IPv6 off on %s: %w", name, err)
}

// IPv6Enabled reports whether the kernel has IPv6 at all.
func IPv6Enabled() bool {
	_, err := os.Stat("/proc/sys/net/ipv6")
	return err == nil
}
