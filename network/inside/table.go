package inside

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/network/egress"
	"github.com/phasegate/phasegate/network/internal/nftexpr"
)

// Table and object names inside a slot's namespace. GuestTable names three
// tables: family ip (the NAT and the tap's filter), family arp (the tap's
// ARP filter) and family ip6 (the tap's IPv6, all dropped).
const (
	GuestTable  = "phasegate_guest"
	EgressTable = "phasegate_egress"
	// DropCounter is the named counter every egress drop goes through.
	DropCounter = "egress_drops"
)

// Chain and set names of the egress table.
const (
	chainFwd      = "fwd"
	chainOut      = "out"
	chainPolicy   = "policy"
	chainProxyPre = "proxy_pre"
	chainProxyOut = "proxy_out"

	setAlwaysAllow = "always_allow"
	setAlwaysDeny  = "always_deny"
	setAllow       = "allow"
	setDeny        = "deny"
)

// Slot is what the tables of one slot depend on.
type Slot struct {
	// NetnsFD is a descriptor of the slot's namespace, open for the call.
	NetnsFD int
	// Uplink is the slot's interface toward the host (eth0).
	Uplink string
	// Inside is the slot's own address on Uplink; Gateway the host end.
	Inside, Gateway netip.Addr
}

// Guest is the microVM guest behind the slot's tap.
type Guest struct {
	// Addr is the guest's address, the same in every slot.
	Addr netip.Addr
	// Tap is the tap's name inside the namespace; "" writes no filter.
	Tap string
	// MAC, when set, is the only source MAC the tap accepts.
	MAC net.HardwareAddr
}

// arpIn is NF_ARP_IN, the arp family's hook for what a link receives
// (ChainHookInput is NF_INET_LOCAL_IN, which is NF_ARP_OUT there).
const arpIn = 0

// Chains of the guest tables.
const (
	chainGuestPre  = "pre"
	chainGuestPost = "post"
	chainGuestTap  = "tap"
)

func (s Slot) conn() (*nftables.Conn, error) {
	c, err := nftables.New(nftables.WithNetNSFd(s.NetnsFD))
	if err != nil {
		return nil, fmt.Errorf("inside: nftables in the slot's namespace: %w", err)
	}
	return c, nil
}

func guestTable() *nftables.Table {
	return &nftables.Table{Name: GuestTable, Family: nftables.TableFamilyIPv4}
}

func guestARPTable() *nftables.Table {
	return &nftables.Table{Name: GuestTable, Family: nftables.TableFamilyARP}
}

func guestIP6Table() *nftables.Table {
	return &nftables.Table{Name: GuestTable, Family: nftables.TableFamilyIPv6}
}

func egressTable() *nftables.Table {
	return &nftables.Table{Name: EgressTable, Family: nftables.TableFamilyINet}
}

func ifname(key expr.MetaKey, name string, eq bool) []expr.Any {
	op := expr.CmpOpEq
	if !eq {
		op = expr.CmpOpNeq
	}
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: op, Register: 1, Data: append([]byte(name), 0)},
	}
}

// ipAddr matches the IPv4 source (offset 12) or destination (16).
func ipAddr(offset uint32, a netip.Addr) []expr.Any {
	b := a.As4()
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: b[:]},
	}
}

func natTo(t expr.NATType, a netip.Addr, port uint16) []expr.Any {
	b := a.As4()
	e := []expr.Any{&expr.Immediate{Register: 1, Data: b[:]}}
	n := &expr.NAT{Type: t, Family: unix.NFPROTO_IPV4, RegAddrMin: 1}
	if port != 0 {
		e = append(e, &expr.Immediate{Register: 2, Data: binaryutil.BigEndian.PutUint16(port)})
		n.RegProtoMin = 2
		n.Specified = true
	}
	return append(e, n)
}

// EnsureGuest writes the guest tables in one transaction: the inside
// address is translated to the guest's on the way in, the guest's to the
// inside address on the way out, and the tap accepts only what the guest
// may send: IPv4 and ARP from the guest's address, and, with g.MAC, from
// that MAC only. Rewriting existing tables changes no established
// connection (conntrack keeps their translation).
//
// The tap's filter is what stops a guest from sending as another address
// inside the slot; the host's reverse-path check (package nft) stops
// anything that leaves the slot with an address not the slot's own,
// whatever the guest or the slot's root does.
func EnsureGuest(s Slot, g Guest) error {
	c, err := s.conn()
	if err != nil {
		return err
	}
	t := c.AddTable(guestTable())
	pre := c.AddChain(&nftables.Chain{Name: chainGuestPre, Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest})
	post := c.AddChain(&nftables.Chain{Name: chainGuestPost, Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
	c.FlushChain(pre)
	c.FlushChain(post)
	c.AddRule(&nftables.Rule{Table: t, Chain: pre, Exprs: slices.Concat(
		ifname(expr.MetaKeyIIFNAME, s.Uplink, true), ipAddr(16, s.Inside), natTo(expr.NATTypeDestNAT, g.Addr, 0))})
	c.AddRule(&nftables.Rule{Table: t, Chain: post, Exprs: slices.Concat(
		ifname(expr.MetaKeyOIFNAME, s.Uplink, true), ipAddr(12, g.Addr), natTo(expr.NATTypeSourceNAT, s.Inside, 0))})
	if g.Tap != "" {
		tapFilter(c, t, g)
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("inside: write tables %s: %w", GuestTable, err)
	}
	return nil
}

// tapFilter adds the tap's filter to c's transaction: chain tap of the ip
// table (prerouting, before conntrack) and of the arp table (input), each
// dropping, with a counter, what does not come from the guest; and of the
// ip6 table (prerouting), dropping all the guest's IPv6, which would
// otherwise reach the slot's own stack (the guest network is IPv4 and
// NATed). A rule rather than the tap's disable_ipv6: a sysctl written in
// a namespace is found by a lookup that walks every namespace's entry of
// the same name, which with 10,000 slots was the dearest step of making a
// guest slot.
func tapFilter(c *nftables.Conn, ipTable *nftables.Table, g Guest) {
	accept := nftables.ChainPolicyAccept
	ip6 := c.AddTable(guestIP6Table())
	ch6 := c.AddChain(&nftables.Chain{Name: chainGuestTap, Table: ip6, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityRaw, Policy: &accept})
	c.FlushChain(ch6)
	c.AddRule(&nftables.Rule{Table: ip6, Chain: ch6, Exprs: slices.Concat(ifname(expr.MetaKeyIIFNAME, g.Tap, true),
		[]expr.Any{&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictDrop}})})
	arpTable := c.AddTable(guestARPTable())
	a := g.Addr.As4()
	for _, f := range []struct {
		table    *nftables.Table
		hook     *nftables.ChainHook
		prio     *nftables.ChainPriority
		mac, src expr.Any // the source MAC and address, as this family reads them
	}{
		{ipTable, nftables.ChainHookPrerouting, nftables.ChainPriorityRaw,
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseLLHeader, Offset: 6, Len: 6},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4}},
		{arpTable, nftables.ChainHookRef(arpIn), nftables.ChainPriorityFilter,
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 8, Len: 6},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 14, Len: 4}},
	} {
		ch := c.AddChain(&nftables.Chain{Name: chainGuestTap, Table: f.table, Type: nftables.ChainTypeFilter,
			Hooknum: f.hook, Priority: f.prio, Policy: &accept})
		c.FlushChain(ch)
		drop := []expr.Any{&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictDrop}}
		fromTap := ifname(expr.MetaKeyIIFNAME, g.Tap, true)
		if len(g.MAC) == 6 {
			c.AddRule(&nftables.Rule{Table: f.table, Chain: ch, Exprs: slices.Concat(fromTap,
				[]expr.Any{f.mac, &expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte(g.MAC)}}, drop)})
		}
		c.AddRule(&nftables.Rule{Table: f.table, Chain: ch, Exprs: slices.Concat(fromTap,
			[]expr.Any{f.src, &expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: a[:]}}, drop)})
	}
}

// ApplyPolicy writes the egress table for p in one transaction: the
// table, chains, sets and counter are made if missing, the sets' elements
// and the policy chain's rules replaced. The drop counter keeps its count.
func ApplyPolicy(s Slot, p egress.Policy, d egress.Defaults) error {
	if err := d.Admit(p); err != nil {
		return err
	}
	c, err := s.conn()
	if err != nil {
		return err
	}
	t := c.AddTable(egressTable())
	c.AddObj(&nftables.CounterObj{Table: t, Name: DropCounter})
	sets := map[string]*nftables.Set{}
	for i, sp := range []struct {
		name string
		list []netip.Prefix
	}{{setAlwaysAllow, d.AlwaysAllow}, {setAlwaysDeny, d.AlwaysDeny}, {setAllow, p.Allow}, {setDeny, p.Deny}} {
		set := &nftables.Set{Table: t, Name: sp.name, ID: uint32(i + 1), KeyType: nftables.TypeIPAddr, Interval: true}
		if err := c.AddSet(set, nil); err != nil {
			return fmt.Errorf("inside: add set %s: %w", sp.name, err)
		}
		c.FlushSet(set)
		for chunk := range slices.Chunk(nftexpr.IntervalElements(sp.list), 1024) {
			if err := c.SetAddElements(set, chunk); err != nil {
				return fmt.Errorf("inside: encode set %s: %w", sp.name, err)
			}
		}
		sets[sp.name] = set
	}
	accept := nftables.ChainPolicyAccept
	base := func(name string, typ nftables.ChainType, hook *nftables.ChainHook, prio *nftables.ChainPriority) *nftables.Chain {
		ch := c.AddChain(&nftables.Chain{Name: name, Table: t, Type: typ, Hooknum: hook, Priority: prio, Policy: &accept})
		c.FlushChain(ch)
		return ch
	}
	fwd := base(chainFwd, nftables.ChainTypeFilter, nftables.ChainHookForward, nftables.ChainPriorityFilter)
	out := base(chainOut, nftables.ChainTypeFilter, nftables.ChainHookOutput, nftables.ChainPriorityFilter)
	proxyPre := base(chainProxyPre, nftables.ChainTypeNAT, nftables.ChainHookPrerouting, nftables.ChainPriorityNATDest)
	proxyOut := base(chainProxyOut, nftables.ChainTypeNAT, nftables.ChainHookOutput, nftables.ChainPriorityNATDest)
	pol := c.AddChain(&nftables.Chain{Name: chainPolicy, Table: t})
	c.FlushChain(pol)

	jump := &expr.Verdict{Kind: expr.VerdictJump, Chain: chainPolicy}
	c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: append(ifname(expr.MetaKeyOIFNAME, s.Uplink, true), jump)})
	c.AddRule(&nftables.Rule{Table: t, Chain: out, Exprs: append(ifname(expr.MetaKeyOIFNAME, s.Uplink, true), jump)})
	for i, r := range policyRules(p, sets) {
		rule := &nftables.Rule{Table: t, Chain: pol, Exprs: r}
		if i == 0 {
			rule.UserData = nftexpr.FingerprintComment(p.Fingerprint(d))
		}
		c.AddRule(rule)
	}
	if p.RedirectTCP {
		notAllowed := slices.Concat(ipv4(), daddrIn(sets[setAlwaysAllow], true), tcp())
		// From the guest (anything not arriving on the uplink) and from the
		// namespace's own processes; never to the namespace's own addresses.
		c.AddRule(&nftables.Rule{Table: t, Chain: proxyPre, Exprs: slices.Concat(
			ifname(expr.MetaKeyIIFNAME, s.Uplink, false), notAllowed, notLocal(), natTo(expr.NATTypeDestNAT, s.Gateway, d.ProxyPort))})
		c.AddRule(&nftables.Rule{Table: t, Chain: proxyOut, Exprs: slices.Concat(
			ifname(expr.MetaKeyOIFNAME, s.Uplink, true), notAllowed, natTo(expr.NATTypeDestNAT, s.Gateway, d.ProxyPort))})
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("inside: write table inet %s: %w", EgressTable, err)
	}
	return nil
}

// policyRules is chain policy, in order.
func policyRules(p egress.Policy, sets map[string]*nftables.Set) [][]expr.Any {
	accept := []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}}
	drop := []expr.Any{&expr.Objref{Type: int(nftables.ObjTypeCounter), Name: DropCounter}, &expr.Verdict{Kind: expr.VerdictDrop}}
	rules := [][]expr.Any{
		slices.Concat(nftexpr.CtState(), accept),
		// IPv6 is judged on the host alone (package nft): a slot without
		// IPv6 sends none past its host end, and a dual-stack slot's is
		// held to the lease's IPv6 CIDRs there. Here it is left alone,
		// uncounted, so that it reaches the host's chain.
		slices.Concat(nfproto(unix.NFPROTO_IPV6), accept),
		slices.Concat(ipv4(), daddrIn(sets[setAlwaysAllow], false), accept),
	}
	if p.RedirectTCP {
		rules = append(rules, slices.Concat(ctDNAT(), accept)) // sent to the proxy
	}
	if p.DenyAll {
		return append(rules, drop)
	}
	return append(rules,
		slices.Concat(ipv4(), daddrIn(sets[setAllow], false), accept),
		slices.Concat(ipv4(), daddrIn(sets[setDeny], false), drop),
		slices.Concat(ipv4(), daddrIn(sets[setAlwaysDeny], false), drop),
	)
}

func nfproto(p byte) []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{p}}}
}

func ipv4() []expr.Any { return nfproto(unix.NFPROTO_IPV4) }

func tcp() []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}}}
}

func daddrIn(set *nftables.Set, invert bool) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Lookup{SourceRegister: 1, SetName: set.Name, SetID: set.ID, Invert: invert},
	}
}

func notLocal() []expr.Any {
	return []expr.Any{
		&expr.Fib{Register: 1, FlagDADDR: true, ResultADDRTYPE: true},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)},
	}
}

// ctStatusDNAT is IPS_DST_NAT: the connection's destination was rewritten.
const ctStatusDNAT = 1 << 5

func ctDNAT() []expr.Any { return nftexpr.CtBits(expr.CtKeySTATUS, ctStatusDNAT) }

// ClearPolicy removes the egress table (a slot going back to the pool
// unleased). A missing table is not an error.
func ClearPolicy(s Slot) error {
	c, err := s.conn()
	if err != nil {
		return err
	}
	c.DelTable(egressTable())
	if err := c.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("inside: delete table inet %s: %w", EgressTable, err)
	}
	return nil
}

// Found is what Inspect read in a slot's namespace.
type Found struct {
	// GuestNAT: the guest table has both its translations.
	GuestNAT bool
	// TapFilter: the three guest tables have their tap chain with its
	// rules.
	TapFilter bool
	// Fingerprint is the applied policy's (egress.Policy.Fingerprint), "" when
	// the namespace has no egress table or it is incomplete.
	Fingerprint string
	// Drops is the egress drop counter's packets.
	Drops uint64
}

// Inspect reads the slot's tables without changing them. g says what the
// tap's filter should hold (its rule count); with no g.Tap TapFilter is
// false.
func Inspect(s Slot, g Guest) (Found, error) {
	c, err := s.conn()
	if err != nil {
		return Found{}, err
	}
	var f Found
	count := func(t *nftables.Table, ch string) (int, error) {
		rules, err := c.GetRules(t, &nftables.Chain{Name: ch})
		if err != nil && !errors.Is(err, unix.ENOENT) {
			return 0, fmt.Errorf("inside: list rules of %s %s: %w", t.Name, ch, err)
		}
		return len(rules), nil
	}
	n := 0
	for _, ch := range []string{chainGuestPre, chainGuestPost} {
		k, err := count(guestTable(), ch)
		if err != nil {
			return Found{}, err
		}
		if k > 0 {
			n++
		}
	}
	f.GuestNAT = n == 2
	if g.Tap != "" {
		want := 1
		if len(g.MAC) == 6 {
			want = 2
		}
		f.TapFilter = true
		for _, t := range []*nftables.Table{guestTable(), guestARPTable(), guestIP6Table()} {
			k, err := count(t, chainGuestTap)
			if err != nil {
				return Found{}, err
			}
			if t.Family == nftables.TableFamilyIPv6 {
				f.TapFilter = f.TapFilter && k == 1 // all of it dropped
				continue
			}
			f.TapFilter = f.TapFilter && k == want
		}
	}
	rules, err := c.GetRules(egressTable(), &nftables.Chain{Name: chainPolicy})
	if err != nil && !errors.Is(err, unix.ENOENT) {
		return Found{}, fmt.Errorf("inside: list rules of %s %s: %w", EgressTable, chainPolicy, err)
	}
	hooked := 0
	for _, ch := range []string{chainFwd, chainOut} {
		if r, err := c.GetRules(egressTable(), &nftables.Chain{Name: ch}); err == nil && len(r) == 1 {
			hooked++
		}
	}
	if len(rules) > 0 && hooked == 2 {
		f.Fingerprint = nftexpr.Fingerprint(rules[0].UserData)
		drops, err := Drops(s)
		if err != nil {
			return Found{}, err
		}
		f.Drops = drops
	}
	return f, nil
}

// Drops returns the packets the egress policy dropped; 0 without a policy.
func Drops(s Slot) (uint64, error) {
	c, err := s.conn()
	if err != nil {
		return 0, err
	}
	// The library's object calls flatten their errors (ENOENT is lost):
	// ask for the table's chain first, whose error keeps it.
	if rules, err := c.GetRules(egressTable(), &nftables.Chain{Name: chainFwd}); errors.Is(err, unix.ENOENT) || err == nil && len(rules) == 0 {
		return 0, nil
	}
	o, err := c.GetObject(&nftables.CounterObj{Table: egressTable(), Name: DropCounter})
	if err != nil {
		return 0, fmt.Errorf("inside: read counter %s: %w", DropCounter, err)
	}
	if co, ok := o.(*nftables.CounterObj); ok {
		return co.Packets, nil
	}
	if no, ok := o.(*nftables.NamedObj); ok {
		if co, ok := no.Obj.(*expr.Counter); ok {
			return co.Packets, nil
		}
	}
	return 0, fmt.Errorf("inside: counter %s: unexpected object %T", DropCounter, o)
}
