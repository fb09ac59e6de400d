package main

import (
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"strconv"
	"strings"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
	"github.com/phasegate/phasegate/network/slot"
)

// The restore part's guest+policy variant runs the daemon with the slot
// guest profile of README's microVM section (a tap with the same guest
// address in every slot, NATed to the slot's own) and leases every slot
// with an egress policy of its own: what a microVM orchestrator's restart
// must keep intact.

// Settings of the guest profile and the daemon's egress defaults.
const (
	guestTap = "tap0"
	// guestProxyPort is the egress proxy's port the policies with
	// redirect_tcp send to (nothing listens there: the rules are measured,
	// not the proxy).
	guestProxyPort = 3128
	// guestAlwaysAllow is --slot-egress-allow: the orchestrator's own
	// address, as E2B's firewall always allows it.
	guestAlwaysAllow = "198.51.100.7/32"
	// Every guestDenyAllEvery-th lease denies all; every
	// guestRedirectEvery-th (offset by one) sends TCP to the proxy.
	guestDenyAllEvery  = 8
	guestRedirectEvery = 4
	// guestSample is how many leases' namespaces are read with nft and ip
	// before and after each restart.
	guestSample = 16
)

// guestPolicyMix says what policies the variant leases with, for the report.
func guestPolicyMix() string {
	return fmt.Sprintf("allow 4 CIDRs and deny 3 (public ranges, one of each per lease its own), except every %dth lease: deny_all; "+
		"every %dth (offset by one) also redirect_tcp to the proxy port %d; daemon defaults `--slot-egress-allow %s`, "+
		"the default `--slot-egress-deny`", guestDenyAllEvery, guestRedirectEvery, guestProxyPort, guestAlwaysAllow)
}

// guestPolicy is the egress policy of the k-th lease (1-based).
func guestPolicy(k int) *phasegatev1.EgressPolicy {
	if k%guestDenyAllEvery == 0 {
		return &phasegatev1.EgressPolicy{DenyAll: true}
	}
	return &phasegatev1.EgressPolicy{
		Allow:       []string{"1.1.1.1/32", "8.8.8.0/24", fmt.Sprintf("23.%d.%d.0/24", k/256%256, k%256), "140.82.112.0/20"},
		Deny:        []string{"13.32.0.0/15", fmt.Sprintf("34.%d.0.0/16", k%256), "52.0.0.0/11"},
		RedirectTcp: k%guestRedirectEvery == 1,
	}
}

// guestGateway is the tap's address of a guest network: the address after
// the guest's (README's 169.254.0.21/30 has 169.254.0.22).
func guestGateway(addr netip.Prefix) netip.Addr { return addr.Addr().Next() }

// guestArgs are the daemon flags of the guest+policy variant.
func guestArgs(addr netip.Prefix) []string {
	return []string{
		"--slot-guest-tap=" + guestTap,
		"--slot-guest-addr=" + addr.String(),
		"--slot-guest-gateway=" + guestGateway(addr).String(),
		"--slot-egress-allow=" + guestAlwaysAllow,
		"--slot-egress-proxy-port=" + strconv.Itoa(guestProxyPort),
		"--slot-host-tcp-ports=" + strconv.Itoa(guestProxyPort),
	}
}

// validGuestAddr checks -guest-addr with the daemon's own rules (the
// guest device's, and its range outside the slot CIDR), so that a bad one
// is refused before anything is leased.
func validGuestAddr(addr netip.Prefix, cidr string) error {
	slots, err := netip.ParsePrefix(cidr)
	if err != nil {
		return fmt.Errorf("-cidr: %w", err)
	}
	c := slot.Config{Prefix: "pgbench-", NetnsDir: "/run/netns", Slots: 1, CIDR: slots.Masked(),
		Guest: slot.Guest{Tap: guestTap, Addr: addr, Gateway: guestGateway(addr)}}
	if err := c.Validate(); err != nil {
		return fmt.Errorf("-guest-addr %s with -cidr %s: %w", addr, cidr, err)
	}
	return nil
}

// canonicalPolicy renders a policy comparably: CIDRs parsed and sorted
// (an address alone is its /32), the modes after.
func canonicalPolicy(p *phasegatev1.EgressPolicy) string {
	if p == nil {
		return "none"
	}
	list := func(in []string) string {
		out := make([]string, 0, len(in))
		for _, s := range in {
			if pr, err := netip.ParsePrefix(s); err == nil {
				s = pr.String()
			} else if a, err := netip.ParseAddr(s); err == nil {
				s = netip.PrefixFrom(a, a.BitLen()).String()
			}
			out = append(out, s)
		}
		slices.Sort(out)
		return strings.Join(out, ",")
	}
	if p.GetDenyAll() {
		// Allow and deny are ignored with deny_all.
		return fmt.Sprintf("deny_all redirect=%t", p.GetRedirectTcp())
	}
	return fmt.Sprintf("allow=%s deny=%s redirect=%t", list(p.GetAllow()), list(p.GetDeny()), p.GetRedirectTcp())
}

// policyMismatches compares the policies the API shows for the owner's
// slots with want (by index) and returns how many leases it checked and
// the first differences (at most a few, for the log).
func policyMismatches(slots []*phasegatev1.Slot, want map[int]string) (checked int, bad []string) {
	seen := make(map[int]bool, len(slots))
	for _, s := range slots {
		i := int(s.GetIndex())
		w, ok := want[i]
		if !ok {
			continue
		}
		seen[i] = true
		checked++
		if got := canonicalPolicy(s.GetEgressPolicy()); got != w {
			bad = append(bad, fmt.Sprintf("slot %d: %s, want %s", i, got, w))
		}
	}
	for i := range want {
		if !seen[i] {
			bad = append(bad, fmt.Sprintf("slot %d: not listed", i))
		}
	}
	slices.Sort(bad)
	return checked, bad
}

// insideSnapshot is what one leased slot's namespace holds of the guest
// device and the policy: `nft -a -s list ruleset` (every table, chain,
// set and rule with its handle, without counter values: a table or rule
// written again has new handles) and the tap's ifindex and name.
func insideSnapshot(ctx context.Context, netnsPath string) (string, error) {
	script := `nft -a -s list ruleset && ip -o link show dev "$0" | cut -d' ' -f1,2`
	out, err := exec.CommandContext(ctx, "nsenter", "--net="+netnsPath, "--", "sh", "-c", script, guestTap).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("nft and ip in %s: %w: %.300s", netnsPath, err, out)
	}
	s := string(out)
	for _, want := range []string{"table inet phasegate_egress", "table ip phasegate_guest", ": " + guestTap + ":"} {
		if !strings.Contains(s, want) {
			return s, fmt.Errorf("%s holds no %q:\n%.2000s", netnsPath, want, s)
		}
	}
	return s, nil
}

// sampleIndices picks up to k of indices, spread evenly over them.
func sampleIndices(indices []int, k int) []int {
	if len(indices) <= k {
		return slices.Clone(indices)
	}
	out := make([]int, 0, k)
	for j := range k {
		out = append(out, indices[j*len(indices)/k])
	}
	return out
}
