// Package ports publishes a lease's slot ports on the host, as DNAT in the
// host's slot table, and owns which lease holds which host port.
//
// A mapping is an optional host address, a host port, a slot port, and
// tcp, udp or sctp; the table is package nft's.
//
// Every mapping is one element of one of two maps, whatever the number of
// mappings: ports_any (protocol . host port : slot address . slot port,
// for a mapping on every address of the host) and ports_addr (host
// address . protocol . host port : the same, for a mapping on one
// address). Three chains of a fixed handful of rules look them up, so that
// one mapping's add is one element in one transaction at 10 mappings as at
// 10,000 (docs/BENCHMARKS.md, "Published ports"):
//
//	table inet <name> {
//		map ports_any  { type inet_proto . inet_service : ipv4_addr . inet_service }
//		map ports_addr { type ipv4_addr . inet_proto . inet_service : ipv4_addr . inet_service }
//
//		chain ports_prerouting {
//			type nat hook prerouting priority dstnat; policy accept;
//			meta nfproto ipv4 dnat ip to ip daddr . meta l4proto . th dport map @ports_addr
//			meta nfproto ipv4 fib daddr type local dnat ip to meta l4proto . th dport map @ports_any
//		}
//		chain ports_output {
//			type nat hook output priority dstnat; policy accept;
//			(the same two rules: the host's own connections)
//		}
//		chain ports_postrouting {
//			type nat hook postrouting priority srcnat; policy accept;
//			meta nfproto ipv4 oifname @slots ct status dnat ip saddr 127.0.0.0/8 masquerade
//			iifname @slots oifname @slots ct status dnat masquerade
//		}
//	}
//
// Prerouting is what other hosts reach, and a slot (its own published
// port: hairpin); output is the host's own connections, on its addresses
// and on 127.0.0.1. A connection from 127.0.0.1 leaves through the slot's
// host end, which must route 127/8 for it (route_localnet, set on the host
// end when a mapping is published) and is masqueraded behind that end's
// address, as the slot could not answer 127.0.0.1. A hairpin is
// masqueraded too: the slot would otherwise see a packet from its own
// address. Package nft's chains do the rest: forward accepts a DNAT'd
// connection into a slot (from a slot too), and antispoof drops what a
// slot sends to 127/8 before it could use route_localnet.
//
// What a published port opens is that port of that slot, and nothing
// more: no other port of the slot is DNAT'd, and a connection to one is
// still dropped by forward's rules (docs/SECURITY.md, "Published ports").
//
// Owners is the one owner of the host ports: a host port is published by
// one lease, and never one the host itself has bound (a bind in the
// host's namespace tells, for every protocol, exactly what a DNAT would
// take from the host).
package ports
