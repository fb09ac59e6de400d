package hostcheck

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	vns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/network/internal/netconf"
	"github.com/phasegate/phasegate/network/internal/osthread"
)

// Config says what Check looks at.
type Config struct {
	// Table is the name of the slots' inet table (slot.Config.TableName).
	Table string
	// HostIfPrefix starts the name of every slot's host interface
	// (slot.Config.HostIfPrefix). It is how rules of other tables that
	// accept slot traffic are recognised, and it goes into the commands
	// Check suggests.
	HostIfPrefix string
	// NetNS is the path of the network namespace to check; empty means the
	// caller's (the host, for the daemon). Tests point it at a namespace
	// that plays the host.
	NetNS string
	// IPv6 says the slots are dual-stack (an IPv6 slot range is set): the host's IPv6
	// forwarding is checked too.
	IPv6 bool
}

// Kind classifies a Problem.
type Kind int

// Kinds of problems.
const (
	// Forwarding: the host does not forward IPv4 for slot interfaces.
	Forwarding Kind = iota + 1
	// ForwardDrop: a chain of another table at the forward hook drops
	// slot traffic, which the slot table's accept cannot override.
	ForwardDrop
	// Masquerade: the slot table has no masquerading postrouting chain.
	Masquerade
	// NoRoute: the host has no IPv4 route beyond its own networks.
	NoRoute
	// Unverifiable: something on the forward path that Check cannot see.
	Unverifiable
	// CheckFailed: the check itself failed (a netlink error, say).
	CheckFailed
)

// kindNames are the kinds' names, for logs and metrics.
var kindNames = [...]string{
	Forwarding:   "forwarding",
	ForwardDrop:  "forward-drop",
	Masquerade:   "masquerade",
	NoRoute:      "no-route",
	Unverifiable: "unverifiable",
	CheckFailed:  "check-failed",
}

// String returns the kind's name, for logs and metrics.
func (k Kind) String() string {
	if k > 0 && int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", int(k))
}

// Problem is one thing that keeps slot traffic from leaving the host, or
// that Check cannot rule out.
type Problem struct {
	Kind Kind
	// Message is one line: what is wrong and the command that fixes it.
	Message string
}

// String returns "kind: message".
func (p Problem) String() string { return p.Kind.String() + ": " + p.Message }

// Report is the result of Check.
type Report struct {
	// Problems in the order found; empty when slot egress should work.
	Problems []Problem
}

// OK reports whether Check found nothing.
func (r Report) OK() bool { return len(r.Problems) == 0 }

// String joins the problems with "; ", or says "ok".
func (r Report) String() string {
	if r.OK() {
		return "ok"
	}
	s := make([]string, 0, len(r.Problems))
	for _, p := range r.Problems {
		s = append(s, p.String())
	}
	return strings.Join(s, "; ")
}

// probeAddr is the destination of the route lookup: TEST-NET-2, which no
// host has a route to except through a default route. Nothing is sent.
var probeAddr = net.IPv4(198, 51, 100, 1)

// Check looks at the host (or cfg.NetNS) and reports what keeps slot
// traffic from leaving it. It changes nothing and sends no packet. A part of
// the check that fails is reported as a CheckFailed problem; the other
// parts still run.
func Check(ctx context.Context, cfg Config) Report {
	var r Report
	add := func(k Kind, format string, a ...any) {
		r.Problems = append(r.Problems, Problem{Kind: k, Message: fmt.Sprintf(format, a...)})
	}
	if cfg.Table == "" || cfg.HostIfPrefix == "" {
		add(CheckFailed, "egress check: Config.Table and Config.HostIfPrefix must be set")
		return r
	}
	nsfd := 0 // mdlayher/netlink: 0 is the caller's namespace
	if cfg.NetNS != "" {
		fd, err := unix.Open(cfg.NetNS, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			add(CheckFailed, "egress check: open netns %s: %v", cfg.NetNS, err)
			return r
		}
		defer unix.Close(fd)
		nsfd = fd
	}
	if err := ctx.Err(); err != nil {
		add(CheckFailed, "egress check: %v", err)
		return r
	}

	all, def, err := forwarding(nsfd)
	switch {
	case err != nil:
		add(CheckFailed, "read IPv4 forwarding (RTM_GETNETCONF): %v; check with `sysctl net.ipv4.ip_forward net.ipv4.conf.default.forwarding`", err)
	case !all:
		add(Forwarding, "net.ipv4.ip_forward is 0: the host does not forward the slots' packets; run `sysctl -w net.ipv4.ip_forward=1` (and persist it in /etc/sysctl.d)")
	case !def:
		add(Forwarding, "net.ipv4.conf.default.forwarding is 0: new slot interfaces inherit it and do not forward; run `sysctl -w net.ipv4.conf.default.forwarding=1` (and persist it in /etc/sysctl.d)")
	}

	if cfg.IPv6 {
		if p, ok := forwarding6(nsfd); !ok {
			r.Problems = append(r.Problems, p)
		}
	}

	if err := checkRoute(nsfd); err != nil {
		var errno unix.Errno
		if errors.As(err, &errno) && (errno == unix.ENETUNREACH || errno == unix.EHOSTUNREACH) {
			add(NoRoute, "no IPv4 default route: slots reach only the networks the host is directly connected to; add one, e.g. `ip route add default via <gateway>`")
		} else {
			add(CheckFailed, "route lookup for %s: %v", probeAddr, err)
		}
	}

	c, err := nftables.New(nftables.WithNetNSFd(nsfd))
	if err != nil {
		add(CheckFailed, "nftables: %v", err)
	} else {
		r.Problems = append(r.Problems, checkTables(c, cfg)...)
	}

	names, err := legacyTables(cfg.NetNS)
	if err != nil {
		add(CheckFailed, "read ip_tables_names: %v", err)
	}
	var hooked []string
	for _, n := range names {
		if n == "filter" || n == "mangle" || n == "security" { // the x_tables tables with a FORWARD chain
			hooked = append(hooked, n)
		}
	}
	if len(hooked) > 0 {
		p := cfg.HostIfPrefix
		add(Unverifiable, "iptables-legacy table(s) %s hook the forward path and nftables cannot show their policy: run `iptables-legacy -S FORWARD`; if it says `-P FORWARD DROP`, run `iptables-legacy -I FORWARD -i %s+ -j ACCEPT && iptables-legacy -I FORWARD -o %s+ -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT`",
			strings.Join(hooked, ", "), p, p)
	}
	return r
}

// forwarding reads net.ipv4.conf.{all,default}.forwarding of the namespace
// nsfd (0: the caller's) through rtnetlink.
func forwarding(nsfd int) (all, def bool, err error) {
	c, err := netconf.Dial(nsfd)
	if err != nil {
		return false, false, err
	}
	defer c.Close()
	if all, err = netconf.Forwarding(c, netconf.IndexAll); err != nil {
		return false, false, err
	}
	def, err = netconf.Forwarding(c, netconf.IndexDefault)
	return all, def, err
}

// forwarding6 checks the IPv6 forwarding of the namespace nsfd, which a
// dual-stack slot's IPv6 needs to leave the host, and says the problem
// when it is off (ok false).
func forwarding6(nsfd int) (p Problem, ok bool) {
	c, err := netconf.Dial(nsfd)
	if err != nil {
		return Problem{Kind: CheckFailed, Message: fmt.Sprintf("read IPv6 forwarding: %v", err)}, false
	}
	defer c.Close()
	switch on, err := netconf.Forwarding6(c, netconf.IndexAll); {
	case err != nil:
		return Problem{Kind: CheckFailed, Message: fmt.Sprintf("read IPv6 forwarding (RTM_GETNETCONF): %v; check with `sysctl net.ipv6.conf.all.forwarding`", err)}, false
	case !on:
		return Problem{Kind: Forwarding, Message: "net.ipv6.conf.all.forwarding is 0: the host does not forward the slots' IPv6; " +
			"run `sysctl -w net.ipv6.conf.all.forwarding=1` (and persist it in /etc/sysctl.d; an uplink configured by router advertisements then needs accept_ra=2)"}, false
	}
	return Problem{}, true
}

// checkRoute looks up the route to probeAddr in the namespace nsfd.
func checkRoute(nsfd int) error {
	var (
		h   *netlink.Handle
		err error
	)
	if nsfd == 0 {
		h, err = netlink.NewHandle()
	} else {
		h, err = netlink.NewHandleAt(vns.NsHandle(nsfd))
	}
	if err != nil {
		return err
	}
	defer h.Close()
	_, err = h.RouteGet(probeAddr)
	return err
}

// legacyTables returns the x_tables (iptables-legacy) tables of the
// namespace at path ("" for the caller's). A kernel without ip_tables has
// none.
func legacyTables(path string) ([]string, error) {
	var b []byte
	read := func() (err error) {
		b, err = os.ReadFile("/proc/thread-self/net/ip_tables_names")
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	var err error
	if path == "" {
		err = read()
	} else {
		err = inNetns(path, read)
	}
	if err != nil {
		return nil, err
	}
	return strings.Fields(string(b)), nil
}

// inNetns runs fn on an OS thread that has entered the namespace at path
// and is never handed back to Go (osthread.Throwaway).
func inNetns(path string, fn func() error) error {
	var err error
	osthread.Throwaway(func() {
		var fd int
		if fd, err = unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
			err = fmt.Errorf("open %s: %w", path, err)
			return
		}
		err = unix.Setns(fd, unix.CLONE_NEWNET)
		unix.Close(fd)
		if err != nil {
			err = fmt.Errorf("setns %s: %w", path, err)
			return
		}
		err = fn()
	})
	return err
}

// checkTables reports a missing masquerade in the slot table and every
// forward chain of another table that drops slot traffic.
func checkTables(c *nftables.Conn, cfg Config) []Problem {
	var out []Problem
	chains, err := c.ListChains()
	if err != nil {
		return []Problem{{CheckFailed, fmt.Sprintf("list nftables chains: %v", err)}}
	}
	masq := false
	for _, ch := range chains {
		if ch.Table.Family == nftables.TableFamilyINet && ch.Table.Name == cfg.Table {
			if ch.Type == nftables.ChainTypeNAT && ch.Hooknum != nil && *ch.Hooknum == *nftables.ChainHookPostrouting {
				masq = true
			}
			continue
		}
		if ch.Hooknum == nil || *ch.Hooknum != *nftables.ChainHookForward || ch.Type != nftables.ChainTypeFilter {
			continue
		}
		if ch.Table.Family != nftables.TableFamilyIPv4 && ch.Table.Family != nftables.TableFamilyINet {
			continue
		}
		j := &judge{c: c, table: ch.Table, prefix: cfg.HostIfPrefix, seen: map[string]bool{}}
		if err := j.walk(ch.Name, 0); err != nil {
			out = append(out, Problem{CheckFailed, fmt.Sprintf("read rules of %s: %v", chainName(ch.Table, ch.Name), err)})
			continue
		}
		policyDrop := ch.Policy != nil && *ch.Policy == nftables.ChainPolicyDrop
		if msg := j.verdict(ch, policyDrop, chains); msg != "" {
			out = append(out, Problem{ForwardDrop, msg})
		}
	}
	if !masq {
		out = append(out, Problem{Masquerade, fmt.Sprintf("table inet %s has no nat postrouting chain, so slot traffic is not masqueraded: the kernel lacks nftables nat (try `modprobe nft_chain_nat nft_masq`), or the table was not made (the daemon makes it at start)", cfg.Table)})
	}
	return out
}

func chainName(t *nftables.Table, chain string) string {
	return fmt.Sprintf("table %s %s chain %s", family(t.Family), t.Name, chain)
}

func family(f nftables.TableFamily) string {
	switch f {
	case nftables.TableFamilyIPv4:
		return "ip"
	case nftables.TableFamilyINet:
		return "inet"
	}
	return fmt.Sprintf("family(%d)", f)
}

// verdict says why the chain drops slot traffic, or "" if it does not.
func (j *judge) verdict(ch *nftables.Chain, policyDrop bool, all []*nftables.Chain) string {
	name := chainName(ch.Table, ch.Name)
	why := ""
	switch {
	case j.dropAll && !(j.out && j.back):
		why = "has a rule that drops every packet"
	case !j.final && policyDrop && !(j.out && j.back):
		why = "has policy drop"
	default:
		return ""
	}
	missing := "the slots' traffic"
	switch {
	case j.out && !j.back:
		missing = "the replies to the slots' traffic"
	case j.back && !j.out:
		missing = "the slots' outgoing traffic"
	}
	// Where to put the fix: iptables-nft tables take iptables commands,
	// and Docker keeps DOCKER-USER for its users' rules.
	p := j.prefix
	var cmds []string
	if ch.Table.Family == nftables.TableFamilyIPv4 && ch.Table.Name == "filter" && strings.ToUpper(ch.Name) == ch.Name {
		target := ch.Name
		if slices.ContainsFunc(all, func(c *nftables.Chain) bool {
			return c.Table.Family == ch.Table.Family && c.Table.Name == ch.Table.Name && c.Name == "DOCKER-USER"
		}) {
			target = "DOCKER-USER"
		}
		if !j.out {
			cmds = append(cmds, fmt.Sprintf("iptables -I %s -i %s+ -j ACCEPT", target, p))
		}
		if !j.back {
			cmds = append(cmds, fmt.Sprintf("iptables -I %s -o %s+ -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT", target, p))
		}
	} else {
		at := fmt.Sprintf("%s %s %s", family(ch.Table.Family), ch.Table.Name, ch.Name)
		if !j.out {
			cmds = append(cmds, fmt.Sprintf("nft insert rule %s iifname \"%s*\" accept", at, p))
		}
		if !j.back {
			cmds = append(cmds, fmt.Sprintf("nft insert rule %s oifname \"%s*\" ct state established,related accept", at, p))
		}
	}
	return fmt.Sprintf("%s (hook forward) %s and drops %s; an accept in the slot table cannot override it (nftables runs every forward chain); run `%s`",
		name, why, missing, strings.Join(cmds, " && "))
}
