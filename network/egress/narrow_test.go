package egress_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/phasegate/phasegate/network/egress"
)

// verdict is what happens to a new packet leaving a slot.
type verdict int

const (
	dropped verdict = iota
	proxied
	direct
)

// verdictOf is the host's rules for one packet, written out as the chain
// is (package nft's slot chain, then its link-local rule), independently
// of the package's set algebra.
func verdictOf(p *egress.Policy, d egress.Defaults, a netip.Addr, tcp bool) verdict {
	in := func(ps []netip.Prefix) bool {
		return slices.ContainsFunc(ps, func(x netip.Prefix) bool { return x.Contains(a) })
	}
	switch {
	case in(d.AlwaysAllow):
		return direct
	case p == nil:
		if in(d.LinkLocal) {
			return dropped
		}
		return direct
	case tcp && p.RedirectTCP:
		return proxied
	case p.DenyAll:
		return dropped
	case in(p.Allow):
		return direct
	case in(p.Deny), in(d.AlwaysDeny), in(d.LinkLocal):
		return dropped
	}
	return direct
}

// boundaries are the first addresses of every piece on which the
// verdicts of the policies are constant: 0, and the first address of
// every range of their lists and of the defaults, and the one after its
// last. Every verdict changes only there, so checking them checks every
// address.
func boundaries(d egress.Defaults, ps ...*egress.Policy) []netip.Addr {
	var lists [][]netip.Prefix
	lists = append(lists, d.AlwaysAllow, d.AlwaysDeny, d.LinkLocal)
	for _, p := range ps {
		if p != nil {
			lists = append(lists, p.Allow, p.Deny)
		}
	}
	at := func(v uint32) netip.Addr {
		var b [4]byte
		binary.BigEndian.PutUint32(b[:], v)
		return netip.AddrFrom4(b)
	}
	out := []netip.Addr{at(0)}
	for _, l := range lists {
		for _, x := range l {
			if !x.Addr().Is4() {
				continue // Narrow and Within speak IPv4: CNI attachments have no IPv6
			}
			b := x.Masked().Addr().As4()
			lo := binary.BigEndian.Uint32(b[:])
			hi := lo | (1<<(32-x.Bits()) - 1)
			out = append(out, at(lo))
			if hi != ^uint32(0) {
				out = append(out, at(hi+1))
			}
		}
	}
	return out
}

// pol parses a policy of the table: "allow a,b deny c denyAll redirect".
func pol(t *testing.T, s string) *egress.Policy {
	t.Helper()
	if s == "none" {
		return nil
	}
	var allow, deny []string
	var denyAll, redirect bool
	f := strings.Fields(s)
	for i := 0; i < len(f); i++ {
		switch f[i] {
		case "allow":
			i++
			allow = strings.Split(f[i], ",")
		case "deny":
			i++
			deny = strings.Split(f[i], ",")
		case "denyAll":
			denyAll = true
		case "redirect":
			redirect = true
		default:
			t.Fatalf("policy %q: %q", s, f[i])
		}
	}
	p, err := egress.Parse(allow, deny, denyAll, redirect)
	if err != nil {
		t.Fatal(err)
	}
	return &p
}

func show(p *egress.Policy) string {
	if p == nil {
		return "none"
	}
	allow, deny := p.Lists()
	return fmt.Sprintf("allow %v deny %v denyAll %t redirect %t", allow, deny, p.DenyAll, p.RedirectTCP)
}

// testDefaults are a daemon's: an always-allowed address inside the
// always-denied set, the default always-denied set with a host address,
// and the link-local range but a slot network cut from it.
func testDefaults() egress.Defaults {
	return egress.Defaults{
		AlwaysAllow: []netip.Prefix{netip.MustParsePrefix("198.51.100.7/32")},
		AlwaysDeny:  append(slices.Clone(egress.DefaultAlwaysDeny), netip.MustParsePrefix("169.254.100.0/22"), netip.MustParsePrefix("192.0.2.77/32")),
		LinkLocal:   egress.Without(netip.MustParsePrefix("169.254.0.0/16"), netip.MustParsePrefix("169.254.100.0/22")),
		ProxyPort:   3128,
	}
}

// A network's policy is a ceiling: Narrow's answer lets out exactly what
// both the network's policy and the container's let out, address by
// address, TCP and not, over the whole IPv4 space; it is the container's
// own policy when that asks for less, the network's when it asks for more
// (the attacks: allow 0.0.0.0/1 and 128.0.0.0/1 under a deny-all network,
// and under a network that leaves the always-denied set denied), and
// computed lists otherwise. What no policy can say is refused.
func TestNarrow(t *testing.T) {
	d := testDefaults()
	many := func(base string, n int) string {
		var s []string
		for i := range n {
			s = append(s, fmt.Sprintf("%s.%d.%d.1/32", base, i/128, 2*(i%128)))
		}
		return strings.Join(s, ",")
	}
	for _, tc := range []struct {
		name, ceiling, asked string
		want                 string // "ceiling", "asked", or the policy computed (show's form)
		err                  string
	}{
		{"a deny-all network, a container asking for every address", "denyAll", "allow 0.0.0.0/1,128.0.0.0/1", "ceiling", ""},
		{"the always-denied set, a container asking for every address", "", "allow 0.0.0.0/1,128.0.0.0/1", "ceiling", ""},
		{"no policy asked for: the network's", "allow 192.0.2.0/24", "none", "ceiling", ""},
		{"the container asks for less", "allow 192.0.2.0/24,198.51.100.0/24", "allow 192.0.2.0/24", "asked", ""},
		{"the container denies all", "allow 192.0.2.0/24", "denyAll", "asked", ""},
		{"the container asks for more", "allow 10.1.0.0/16", "allow 10.0.0.0/8", "ceiling", ""},
		{"both deny", "deny 8.8.8.0/24", "deny 1.1.1.0/24", "allow [] deny [1.1.1.0/24 8.8.8.0/24] denyAll false redirect false", ""},
		{"part of the container's allowance is the network's", "allow 10.1.0.0/16", "allow 10.1.2.0/24,10.9.0.0/16", "allow [10.1.2.0/24] deny [] denyAll false redirect false", ""},
		{"each narrows the other", "allow 10.1.0.0/16 deny 8.8.8.0/24", "allow 10.1.5.0/24,10.2.0.0/16", "allow [10.1.5.0/24] deny [8.8.8.0/24] denyAll false redirect false", ""},
		{"allow over deny within one policy", "allow 10.0.0.0/8 deny 10.1.0.0/16", "allow 10.0.0.0/9 deny 10.2.0.0/16", "asked", ""},
		{"allow over deny, computed", "allow 10.0.0.0/8 deny 10.1.0.0/16", "allow 10.0.0.0/9,172.16.0.0/12", "allow [10.0.0.0/9] deny [] denyAll false redirect false", ""},
		{"a range cut from the network's allowance", "allow 10.0.0.0/8", "allow 10.0.0.0/8 deny 10.2.0.0/16,172.16.0.0/12", "asked", ""},
		{"the network's deny kept under the container's wider allowance", "allow 10.0.0.0/8 deny 8.8.8.0/24", "allow 10.0.0.0/8,172.16.0.0/12", "allow [10.0.0.0/8] deny [8.8.8.0/24] denyAll false redirect false", ""},
		{"a hole cut from the network's allowance", "allow 10.0.0.0/8", "allow 10.0.0.0/9,10.128.0.0/10,10.192.0.0/11,10.224.0.0/12,10.240.0.0/13,10.248.0.0/14,10.252.0.0/15,10.254.0.0/16,172.16.0.0/12", "allow [10.0.0.0/9 10.128.0.0/10 10.192.0.0/11 10.224.0.0/12 10.240.0.0/13 10.248.0.0/14 10.252.0.0/15 10.254.0.0/16] deny [] denyAll false redirect false", ""},
		{"no network policy, the container allows the metadata service", "none", "allow 169.254.169.254/32", "allow [] deny [] denyAll false redirect false", ""},
		{"no network policy, the container's denies", "none", "deny 8.8.8.8/32", "asked", ""},
		{"no network policy, a deny-all container", "none", "denyAll", "asked", ""},
		{"the network allows the metadata service, the container the same", "allow 169.254.169.254/32", "allow 169.254.169.254/32,1.1.1.1/32", "asked", ""},
		{"the network allows the metadata service, the container more", "allow 169.254.169.254/32", "allow 169.254.0.0/16", "ceiling", ""},
		{"the network allows the metadata service, the container denies", "allow 169.254.169.254/32", "deny 8.8.8.8/32", "asked", ""},
		{"proxied both", "redirect", "redirect deny 8.8.8.0/24", "asked", ""},
		{"a proxied deny-all network, a container asking for every address", "redirect denyAll", "allow 0.0.0.0/1,128.0.0.0/1", "ceiling", ""},
		{"a proxied network, a container that denies some addresses", "redirect", "deny 8.8.8.0/24", "", "TCP would go to the egress proxy for some addresses"},
		{"a network without the proxy, a container asking for it", "deny 8.8.8.0/24", "redirect", "", "TCP would go to the egress proxy for some addresses"},
		{"a proxied network, a proxied container that allows more", "redirect allow 10.1.0.0/16", "redirect allow 10.1.0.0/16,10.2.0.0/16 deny 8.8.8.0/24", "allow [10.1.0.0/16] deny [8.8.8.0/24] denyAll false redirect true", ""},
		{"too many ranges together", "deny " + many("11", egress.MaxEntries), "deny " + many("12", egress.MaxEntries), "", fmt.Sprintf("at most %d", egress.MaxEntries)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ceiling, asked := pol(t, tc.ceiling), pol(t, tc.asked)
			got, err := egress.Narrow(ceiling, asked, d)
			switch {
			case tc.err != "" && (err == nil || !errors.Is(err, egress.ErrInvalid) || !strings.Contains(err.Error(), tc.err)):
				t.Fatalf("got %s, %v; want ErrInvalid saying %q", show(got), err, tc.err)
			case tc.err != "":
				return
			case err != nil:
				t.Fatal(err)
			case tc.want == "ceiling" && got != ceiling, tc.want == "asked" && got != asked:
				t.Fatalf("got %s, want the %s policy as given: %s", show(got), tc.want, show(map[string]*egress.Policy{"ceiling": ceiling, "asked": asked}[tc.want]))
			case tc.want != "ceiling" && tc.want != "asked" && show(got) != tc.want:
				t.Fatalf("got %s, want %s", show(got), tc.want)
			}
			checkNarrowed(t, d, ceiling, asked, got)
			if !egress.Within(got, ceiling, d) {
				t.Errorf("%s is not within the network's %s", show(got), show(ceiling))
			}
		})
	}
}

// checkNarrowed checks got, what Narrow answered for ceiling and asked: a
// policy a client could give, whose verdict at every address is the lesser
// of the two policies'.
func checkNarrowed(t *testing.T, d egress.Defaults, ceiling, asked, got *egress.Policy) {
	t.Helper()
	if got != nil {
		allow, deny := got.Lists()
		again, err := egress.Parse(allow, deny, got.DenyAll, got.RedirectTCP)
		if err != nil || show(&again) != show(got) {
			t.Fatalf("the answer is not a policy a client could give: %v (%s)", err, show(&again))
		}
	}
	want := func(a netip.Addr, tcp bool) verdict {
		if asked == nil {
			return verdictOf(ceiling, d, a, tcp)
		}
		return min(verdictOf(ceiling, d, a, tcp), verdictOf(asked, d, a, tcp))
	}
	for _, a := range boundaries(d, ceiling, asked, got) {
		for _, tcp := range []bool{false, true} {
			if g, w := verdictOf(got, d, a, tcp), want(a, tcp); g != w {
				t.Fatalf("%s (tcp %t): %d under %s, want %d", a, tcp, g, show(got), w)
			}
		}
	}
}

func TestWithout(t *testing.T) {
	got := egress.Without(netip.MustParsePrefix("169.254.0.0/16"), netip.MustParsePrefix("169.254.100.0/22"))
	want := []string{"169.254.0.0/18", "169.254.64.0/19", "169.254.96.0/22", "169.254.104.0/21", "169.254.112.0/20", "169.254.128.0/17"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("got %v, want %v", got, want)
	}
	if got := egress.Without(netip.MustParsePrefix("169.254.0.0/16"), netip.MustParsePrefix("100.64.0.0/10")); fmt.Sprint(got) != "[169.254.0.0/16]" {
		t.Errorf("a cut elsewhere: got %v", got)
	}
	if got := egress.Without(netip.MustParsePrefix("169.254.0.0/16"), netip.MustParsePrefix("169.254.0.0/15")); len(got) != 0 {
		t.Errorf("a cut covering it: got %v", got)
	}
}

// BenchmarkNarrow is the ceiling's cost in an ADD with capability args: a
// conflist's few ranges and a container's few, and two lists of the
// largest size, computed.
func BenchmarkNarrow(b *testing.B) {
	d := testDefaults()
	parse := func(allow, deny []string) *egress.Policy {
		p, err := egress.Parse(allow, deny, false, false)
		if err != nil {
			b.Fatal(err)
		}
		return &p
	}
	var many, others []string
	for i := range egress.MaxEntries / 2 {
		many = append(many, fmt.Sprintf("11.%d.%d.1/32", i/128, 2*(i%128)))
		others = append(others, fmt.Sprintf("12.%d.%d.1/32", i/128, 2*(i%128)))
	}
	for _, bc := range []struct {
		name              string
		ceiling, narrowed *egress.Policy
	}{
		{"small", parse([]string{"10.1.0.0/16"}, []string{"8.8.8.0/24"}), parse([]string{"10.1.5.0/24", "10.2.0.0/16"}, nil)},
		{"2048+2048", parse(nil, many), parse(nil, others)},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				if _, err := egress.Narrow(bc.ceiling, bc.narrowed, d); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
