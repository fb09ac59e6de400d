package nft_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"testing"

	"github.com/phasegate/phasegate/internal/rawip"
	"github.com/phasegate/phasegate/network/egress"
	"github.com/phasegate/phasegate/network/internal/fakehost"
	"github.com/phasegate/phasegate/network/nft"
)

// BenchmarkSlotPath measures what a slot's datagram costs on its way out
// through the host's table: one send from the slot, which the kernel
// forwards, filters and masquerades to the outside network within the
// send (veth hands the packet to the host's stack in the sender's
// context), per op. The tables compared, in one run:
//
//   - none: no table at all, the kernel's own path;
//   - before: the table without its antispoof and egress chains (what
//     the slot table held before they were added);
//   - after: the whole table, the slot without an egress policy;
//   - policy: the whole table and a lease policy of 4,096 allowed and
//     4,096 denied ranges that the destination is in neither of, so the
//     packet meets every lookup.
//
// "flow" sends on one connected socket: conntrack finds its entry, but
// with no reply a UDP flow is never established, so every packet meets
// every rule (the worst case of a flow); "new" sends each datagram from
// another source port over a raw socket (every packet also a new conntrack
// entry).
//
//	go test -run '^$' -bench SlotPath -benchtime 20000x -count 20 ./network/nft/ | benchstat -col /table -
func BenchmarkSlotPath(b *testing.B) {
	for _, table := range []string{"none", "before", "after", "policy"} {
		for _, mode := range []string{"flow", "new"} {
			b.Run(fmt.Sprintf("table=%s/packets=%s", table, mode), func(b *testing.B) {
				h := pathHost(b, table)
				s1 := h.Slots[0]
				to := netip.AddrPortFrom(fakehost.OutsideUplink.Addr(), portOutside)
				sink, err := fakehost.ListenUDP(h.Outside, to)
				if err != nil {
					b.Fatal(err)
				}
				defer sink.Close()
				_ = sink.SetReadBuffer(64 << 20)
				go drain(sink)
				if mode == "flow" {
					c, err := fakehost.DialUDP(s1.NetnsPath, to)
					if err != nil {
						b.Fatal(err)
					}
					defer c.Close()
					msg := make([]byte, 64)
					b.ResetTimer()
					for range b.N {
						if _, err := c.Write(msg); err != nil {
							b.Fatal(err)
						}
					}
					return
				}
				src := s1.InsideAddr.Addr()
				err = fakehost.Do(s1.NetnsPath, func() error {
					b.ResetTimer()
					for k := range b.N {
						p := rawip.UDP(netip.AddrPortFrom(src, uint16(1024+k%60000)), to, make([]byte, 36))
						if err := rawip.Send(p); err != nil {
							return err
						}
					}
					return nil
				})
				if err != nil {
					b.Fatal(err)
				}
			})
		}
	}
}

// pathHost is a fake host with one slot and the table as named.
func pathHost(b *testing.B, table string) *fakehost.Host {
	b.Helper()
	h := fakehost.New(b, 1, true)
	if table == "none" {
		// Masquerade alone, as any host that forwards its slots needs.
		mustRun(b, "nsenter", "--net="+h.Path, "nft", "add table ip bare; add chain ip bare post { type nat hook postrouting priority srcnat; }; add rule ip bare post oifname up0 masquerade")
		return h
	}
	// The daemon's always-denied ranges but TEST-NET-1, where the fake
	// outside is: under a policy the packet then meets every lookup.
	d := egress.Defaults{AlwaysDeny: slices.DeleteFunc(slices.Clone(egress.DefaultAlwaysDeny), func(p netip.Prefix) bool {
		return p.Contains(fakehost.OutsideUplink.Addr())
	})}
	tbl, err := nft.New(h.Config.TableName(), nft.WithNetNS(h.Path), nft.WithSlotNetwork(h.Config.CIDR), nft.WithEgress(d))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if err := tbl.Ensure(ctx); err != nil {
		b.Fatal(err)
	}
	if err := tbl.Add(ctx, h.HostIfs()...); err != nil {
		b.Fatal(err)
	}
	switch table {
	case "before":
		for _, ch := range []string{nft.ChainSpoof, nft.ChainEgress} {
			mustRun(b, "nsenter", "--net="+h.Path, "nft", "delete", "chain", "inet", tbl.Name(), ch)
		}
	case "policy":
		p := egress.Policy{Allow: ranges(4096, 20), Deny: ranges(4096, 30)}
		if err := tbl.SetEgress(ctx, h.Slots[0].HostIf, p); err != nil {
			b.Fatal(err)
		}
	}
	return h
}

// ranges returns n /24s from first.0.0.0 on.
func ranges(n int, first byte) []netip.Prefix {
	out := make([]netip.Prefix, n)
	for i := range n {
		var a [4]byte
		binary.BigEndian.PutUint32(a[:], uint32(first)<<24|uint32(i)<<8)
		out[i] = netip.PrefixFrom(netip.AddrFrom4(a), 24)
	}
	return out
}

func drain(c *net.UDPConn) {
	buf := make([]byte, 2048)
	for {
		if _, err := c.Read(buf); err != nil {
			return
		}
	}
}

func mustRun(b *testing.B, name string, args ...string) {
	b.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		b.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
}
