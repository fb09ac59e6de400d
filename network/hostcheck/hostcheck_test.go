package hostcheck_test

import (
	"context"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/internal/leakcheck"
	"github.com/phasegate/phasegate/network/hostcheck"
	"github.com/phasegate/phasegate/network/internal/fakehost"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

// host builds a fake host with 2 slots and the slot table installed.
func host(t *testing.T, forwarding bool) (*fakehost.Host, hostcheck.Config) {
	t.Helper()
	h := fakehost.New(t, 2, forwarding)
	h.SlotTable(t)
	return h, hostcheck.Config{Table: h.Config.TableName(), HostIfPrefix: h.Config.HostIfPrefix(), NetNS: h.Path}
}

// egressWorks says whether a datagram from slot 1 reaches the outside
// network (masqueraded). wait bounds a negative answer; the tests pair every
// negative answer with a positive one on the same host once fixed.
func egressWorks(t *testing.T, h *fakehost.Host, wait time.Duration) bool {
	t.Helper()
	ln, err := fakehost.ListenUDP(h.Outside, netip.AddrPortFrom(fakehost.OutsideUplink.Addr(), 7100))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	src, ok, err := fakehost.UDPReaches(h.Slots[0].NetnsPath, ln, wait)
	if err != nil {
		t.Fatal(err)
	}
	if ok && src != fakehost.HostUplink.Addr() {
		t.Errorf("outside saw %s, want the host's uplink %s", src, fakehost.HostUplink.Addr())
	}
	return ok
}

// only fails unless the report has exactly one problem, of kind k, whose
// message contains every string of want.
func only(t *testing.T, r hostcheck.Report, k hostcheck.Kind, want ...string) hostcheck.Problem {
	t.Helper()
	if len(r.Problems) != 1 || r.Problems[0].Kind != k {
		t.Fatalf("report = %v, want one %v problem", r, k)
	}
	p := r.Problems[0]
	t.Logf("%v", p)
	for _, w := range want {
		if !strings.Contains(p.Message, w) {
			t.Errorf("message %q does not contain %q", p.Message, w)
		}
	}
	if strings.Contains(p.Message, "\n") {
		t.Errorf("message is not one line: %q", p.Message)
	}
	return p
}

func TestHealthyHost(t *testing.T) {
	h, cfg := host(t, true)
	if r := hostcheck.Check(context.Background(), cfg); !r.OK() {
		t.Errorf("Check on a working host = %v", r)
	}
	if !egressWorks(t, h, 10*time.Second) {
		t.Errorf("egress does not work on the host the check passed")
	}
}

func TestForwardingOff(t *testing.T) {
	h, cfg := host(t, false)
	only(t, hostcheck.Check(context.Background(), cfg), hostcheck.Forwarding, "net.ipv4.ip_forward is 0", "sysctl -w net.ipv4.ip_forward=1")
	if egressWorks(t, h, time.Second) {
		t.Errorf("egress works with forwarding off")
	}
	if err := fakehost.Sysctl(h.Path, "net/ipv4/ip_forward", "1"); err != nil {
		t.Fatal(err)
	}
	if err := fakehost.Sysctl(h.Path, "net/ipv4/conf/default/forwarding", "0"); err != nil {
		t.Fatal(err)
	}
	only(t, hostcheck.Check(context.Background(), cfg), hostcheck.Forwarding, "net.ipv4.conf.default.forwarding is 0")
	if !egressWorks(t, h, 10*time.Second) { // the existing veths kept forwarding on
		t.Errorf("egress does not work with ip_forward=1")
	}
}

// With dual-stack slots the host's IPv6 forwarding is checked as its
// IPv4's: off (a new namespace's default), it is the one problem; on, none.
func TestIPv6ForwardingOff(t *testing.T) {
	h, cfg := host(t, true)
	cfg.IPv6 = true
	only(t, hostcheck.Check(context.Background(), cfg), hostcheck.Forwarding, "net.ipv6.conf.all.forwarding is 0", "sysctl -w net.ipv6.conf.all.forwarding=1")
	if err := fakehost.Sysctl(h.Path, "net/ipv6/conf/all/forwarding", "1"); err != nil {
		t.Fatal(err)
	}
	if r := hostcheck.Check(context.Background(), cfg); !r.OK() {
		t.Errorf("Check with IPv6 forwarding on = %v", r)
	}
}

func TestMissingTable(t *testing.T) {
	h := fakehost.New(t, 1, true)
	cfg := hostcheck.Config{Table: h.Config.TableName(), HostIfPrefix: h.Config.HostIfPrefix(), NetNS: h.Path}
	only(t, hostcheck.Check(context.Background(), cfg), hostcheck.Masquerade, "table inet "+cfg.Table)
	if r := hostcheck.Check(context.Background(), hostcheck.Config{}); len(r.Problems) != 1 || r.Problems[0].Kind != hostcheck.CheckFailed {
		t.Errorf("empty config: %v", r)
	}
}

func TestNoRoute(t *testing.T) {
	_, cfg := host(t, true)
	sh(t, cfg.NetNS, "ip route del default")
	only(t, hostcheck.Check(context.Background(), cfg), hostcheck.NoRoute, "no IPv4 default route")
}

// nftConn opens an nftables connection in the namespace at path.
func nftConn(t *testing.T, path string) *nftables.Conn {
	t.Helper()
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	c, err := nftables.New(nftables.WithNetNSFd(fd))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func ifname(prefix string) []expr.Any { // `iifname "<prefix>*"`, no NUL: a wildcard
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte(prefix)}}
}

// A native nftables forward chain with policy drop (or a drop-everything
// rule) in another table breaks egress; the check says so and recognises
// the rules it suggests.
func TestForeignForwardDrop(t *testing.T) {
	h, cfg := host(t, true)
	ctx := context.Background()
	c := nftConn(t, h.Path)
	fw := c.AddTable(&nftables.Table{Name: "fw", Family: nftables.TableFamilyINet})
	drop := nftables.ChainPolicyDrop
	fwd := c.AddChain(&nftables.Chain{Name: "forward", Table: fw, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &drop})
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	only(t, hostcheck.Check(ctx, cfg), hostcheck.ForwardDrop, "table inet fw chain forward", "policy drop",
		`nft insert rule inet fw forward iifname "`+cfg.HostIfPrefix+`*" accept`,
		`nft insert rule inet fw forward oifname "`+cfg.HostIfPrefix+`*" ct state established,related accept`)
	if egressWorks(t, h, time.Second) {
		t.Fatalf("egress works through a forward chain with policy drop")
	}

	// The suggested rules, as `nft insert rule` would make them.
	c.AddRule(&nftables.Rule{Table: fw, Chain: fwd, Exprs: append(ifname(cfg.HostIfPrefix), &expr.Verdict{Kind: expr.VerdictAccept})})
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	only(t, hostcheck.Check(ctx, cfg), hostcheck.ForwardDrop, "drops the replies to the slots' traffic", "ct state established,related accept")
	out := ifname(cfg.HostIfPrefix)
	out[0].(*expr.Meta).Key = expr.MetaKeyOIFNAME
	c.AddRule(&nftables.Rule{Table: fw, Chain: fwd, Exprs: append(out,
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED),
			Xor:  binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
		&expr.Verdict{Kind: expr.VerdictAccept})})
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	if r := hostcheck.Check(ctx, cfg); !r.OK() {
		t.Errorf("Check after the suggested fix = %v", r)
	}
	if !egressWorks(t, h, 10*time.Second) {
		t.Errorf("egress does not work after the suggested fix")
	}

	// A drop-everything rule before the accepts, in a chain with policy accept.
	accept := nftables.ChainPolicyAccept
	early := c.AddChain(&nftables.Chain{Name: "early", Table: fw, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityRef(-10), Policy: &accept})
	c.AddRule(&nftables.Rule{Table: fw, Chain: early, Exprs: []expr.Any{&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictDrop}}})
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	only(t, hostcheck.Check(ctx, cfg), hostcheck.ForwardDrop, "table inet fw chain early", "drops every packet")
}

// Docker's shape through iptables-nft: `ip filter FORWARD` with policy
// DROP jumping to DOCKER-USER. The suggested iptables commands, run as
// printed, make the problem go away and egress work.
func TestDockerForward(t *testing.T) {
	if _, err := exec.LookPath("iptables"); err != nil {
		t.Skip("iptables not installed (tools/deps.sh installs it)")
	}
	if out, err := exec.Command("iptables", "-V").CombinedOutput(); err != nil || !strings.Contains(string(out), "nf_tables") {
		t.Skipf("iptables is not iptables-nft: %s", out)
	}
	h, cfg := host(t, true)
	ctx := context.Background()
	sh(t, h.Path, "iptables -N DOCKER-USER && iptables -A FORWARD -j DOCKER-USER && iptables -A DOCKER-USER -j RETURN && iptables -P FORWARD DROP")
	p := only(t, hostcheck.Check(ctx, cfg), hostcheck.ForwardDrop, "table ip filter chain FORWARD", "iptables -I DOCKER-USER -i "+cfg.HostIfPrefix+"+ -j ACCEPT")
	if egressWorks(t, h, time.Second) {
		t.Fatalf("egress works through Docker's FORWARD DROP")
	}
	_, cmd, ok := strings.Cut(p.Message, "run `")
	if !ok {
		t.Fatalf("no command in %q", p.Message)
	}
	sh(t, h.Path, strings.TrimSuffix(cmd, "`"))
	if r := hostcheck.Check(ctx, cfg); !r.OK() {
		t.Errorf("Check after running the suggested command = %v", r)
	}
	if !egressWorks(t, h, 10*time.Second) {
		t.Errorf("egress does not work after the suggested command")
	}
}

// iptables-legacy tables cannot be seen through nftables: the check says
// they exist and how to look.
func TestLegacyTables(t *testing.T) {
	if _, err := exec.LookPath("iptables-legacy"); err != nil {
		t.Skip("iptables-legacy not installed (Debian's iptables package ships it)")
	}
	h, cfg := host(t, true)
	sh(t, h.Path, "iptables-legacy -P FORWARD ACCEPT")
	only(t, hostcheck.Check(context.Background(), cfg), hostcheck.Unverifiable, "iptables-legacy -S FORWARD", "iptables-legacy -I FORWARD -i "+cfg.HostIfPrefix+"+ -j ACCEPT")
}

// sh runs a shell command inside the namespace at path.
func sh(t *testing.T, path, cmd string) {
	t.Helper()
	out, err := exec.Command("nsenter", "--net="+path, "sh", "-c", cmd).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", cmd, err, out)
	}
}
