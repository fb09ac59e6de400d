// Package nft manages the host firewall of network slots, where no tenant
// can reach it.
//
// It keeps one nftables table per slot prefix that isolates the slots, drops
// what they send from addresses not their own, and enforces their leases'
// egress policies.
//
// The table holds a set of the slots' host interfaces and a fixed handful of
// rules that filter, forward and masquerade by set lookup, and a chain per
// slot with an egress policy, reached through one map lookup. Adding or
// removing a slot is one set-element change; the rule count of the fixed
// chains never grows with the number of slots.
//
// The table looks like this in `nft list table inet <name>` (nftables
// 1.0.6; default Isolation, dual-stack slots (WithSlotNetwork6), two
// slots, slot 2 leased with an egress policy; the port sets, the egress
// defaults' sets and package ports' maps and chains omitted):
//
//	table inet <name> {
//		map egress_policy {
//			type ifname : verdict
//			elements = { "pg-h2" : jump egress_pg-h2 }
//		}
//
//		set slots {
//			type ifname
//			elements = { "pg-h1",
//				     "pg-h2" }
//		}
//
//		chain antispoof {
//			type filter hook prerouting priority raw; policy accept;
//			iifname @slots fib saddr . iif oif missing counter drop comment "spoofed"
//			iifname @slots ip daddr 127.0.0.0/8 counter drop comment "to-loopback"
//		}
//
//		chain egress {
//			type filter hook prerouting priority mangle; policy accept;
//			iifname @slots ct state established,related accept comment "table 3f1c…"
//			iifname @slots icmpv6 type nd-router-advert counter drop comment "ra-redirect"
//			iifname @slots icmpv6 type nd-redirect counter drop comment "ra-redirect"
//			iifname @slots icmpv6 type 135-136 ip6 hoplimit 255 fib daddr . iif type 2-5 accept
//			iifname @slots ip daddr @egress_always_allow accept
//			iifname @slots iifname vmap @egress_policy
//			iifname @slots ip daddr 169.254.0.0/16 ip daddr != 169.254.128.0/19 counter drop comment "link-local"
//			iifname @slots ip6 daddr fe80::/10 counter drop comment "link-local"
//		}
//
//		chain forward {
//			type filter hook forward priority filter; policy accept;
//			iifname @slots oifname @slots ct status dnat accept
//			iifname @slots oifname @slots counter drop comment "slot-to-slot"
//			iifname @slots accept
//			oifname @slots ct state established,related accept
//			oifname @slots ct status dnat accept
//			oifname @slots counter drop comment "inbound"
//		}
//
//		chain input {
//			type filter hook input priority filter; policy accept;
//			iifname @slots ct state established,related accept
//			iifname @slots icmpv6 type 135-136 ip6 hoplimit 255 fib daddr . iif type 2-5 accept
//			iifname @slots icmpv6 type echo-request fib daddr . iif type local accept
//			iifname @slots icmp type echo-request fib daddr . iif type local accept
//			iifname @slots tcp dport @host_tcp fib daddr . iif type local accept
//			iifname @slots udp dport @host_udp fib daddr . iif type local accept
//			iifname @slots counter drop comment "to-host"
//		}
//
//		chain postrouting {
//			type nat hook postrouting priority srcnat; policy accept;
//			iifname @slots oifname != @slots masquerade
//		}
//
//		chain egress_pg-h2 {
//			ip daddr 10.1.0.0/16 accept comment "policy 4d9a3f5a…"
//			ip6 daddr 2001:db8:1::/48 accept
//			ip daddr 203.0.113.0/24 counter drop
//			ip daddr @egress_always_deny counter drop
//			ip6 daddr @egress_always_deny6 counter drop
//		}
//	}
//
// The slots set lists the host ends of the slots by name because its user
// data carries the key's byte order, as nft itself writes it for `type
// ifname`; the kernel ignores that data, and without it nft prints every
// element as "" (the rules match all the same). A table made by an earlier
// version, whose set lacks it, is made readable by Ensure in the transaction
// that rewrites the rules (TestListingNamesEveryElement,
// TestEnsureMakesAnOldSetReadable).
//
// # What a slot may reach, and why
//
// Slots are tenants of one another. A host that runs sandboxes with network
// access forwards packets (net.ipv4.ip_forward=1), and the kernel routes one
// slot's packet to another slot's inside address straight across the host:
// without a rule against it, every tenant can reach every other tenant's
// listening sockets. So:
//
//   - Slot to slot (forward, in and out interfaces both slots): dropped,
//     but for a connection DNAT'd to a published port (package ports: a
//     slot reaching its own port at the host's address, hairpin, or
//     another's, as any host may).
//     Isolation.AllowSlotToSlot turns the verdict into accept, for an operator
//     whose tenants are one party. The rule is kept either way, so the rule
//     count does not depend on the policy.
//
//   - Slot to anywhere else (forward, in interface a slot): accepted, and
//     masqueraded behind the host's address on the way out.
//
//   - Anywhere else to a slot (forward, out interface a slot): only replies
//     and related ICMP errors of connections the slot opened, and connections
//     DNAT'd to a published port (package ports' maps, or the operator's
//     own DNAT rule: ct status dnat); everything else is dropped. The host itself reaches a slot through
//     its output path, which this table leaves alone, so an orchestrator on
//     the host can still connect into its sandboxes.
//
//   - Slot to the host itself (input: any address of the host, including the
//     host ends of other slots' veths and the host's own uplink address):
//     replies and related packets of connections the host opened (which is
//     also how ICMP errors such as "fragmentation needed" for path MTU
//     discovery get through), ping of the slot's own gateway, and the TCP
//     and UDP ports of Isolation.HostTCPPorts and Isolation.HostUDPPorts, which an
//     operator lists for services offered to tenants (a DNS resolver on the
//     host, say). Both are accepted only at the slot's own gateway address
//     (the host end of its veth: `fib daddr . iif type local`), never at
//     another address of the host. Everything else is dropped: an sshd, a
//     metrics endpoint or the daemon's own API listening on all addresses
//     is not the tenants' business. The same rules apply to IPv6 (a slot's
//     eth0 has only a link-local IPv6 address; the ping rule is IPv4 only).
//
//   - From an address that is not its own (antispoof, before conntrack):
//     dropped. The check is the kernel's strict reverse-path test (what
//     rp_filter=1 does) in this table, whatever the host's sysctls: the
//     packet's source must be routed back through the interface it came
//     in on, and only the slot's own inside address is (its /31's route is
//     on its host end). A tenant with CAP_NET_RAW in its namespace, or a
//     microVM guest whose slot lost its NAT, therefore cannot send as
//     another slot, the host or anyone: such a packet is dropped before
//     conntrack sees it, so it neither opens nor changes a connection of
//     the address it claims, and no reply can be sent to the victim. It
//     needs no per-slot state: the routes are the slots'.
//
//   - To a link-local address (egress, after conntrack): dropped, unless
//     the daemon always allows it or the slot's lease does. The cloud
//     metadata service is there (169.254.169.254), and link-local
//     addresses are not to be forwarded anyway; the slots' own network is
//     spared (WithSlotNetwork), since the default one is link-local.
//
//   - Under a lease's egress policy (egress): the map egress_policy sends
//     the slot's packets to its own chain, egress_<host interface>, which
//     SetEgress writes in one transaction with the same rules as the
//     slot's own egress table (package inside) and the daemon's
//     always-denied set (WithEgress); the always-allowed set is accepted
//     in chain egress before the map, for every slot. Root in the slot
//     can flush the tables of its namespace; it cannot reach these. A slot
//     without a policy has no chain and only the link-local rule applies.
//     The chain is made and replaced by SetEgress, and removed with the
//     slot's element (Remove) or by ClearEgress; AddNew clears one left
//     under a new slot's name. The rule count of the fixed chains never
//     grows: the map is one lookup whatever the number of slots.
//
// Drops are silent (no ICMP reject): a tenant probing the host or its
// neighbours learns nothing, at the price of a connect timeout instead of a
// refusal. Each drop rule has a counter, which Table.Drops reads.
//
// Rules in this table cannot override a drop in another table at the same
// hook: nftables runs every base chain registered at a hook, and an accept
// ends only the chain it is in. A forward chain with policy drop elsewhere
// (Docker's `ip filter FORWARD` through iptables-nft is the common one)
// silently breaks slot egress; package egress detects it.
//
// Ensure writes the whole ruleset in one transaction and can be called on a
// table made by an earlier run (or an earlier version): chains are flushed
// and their rules rewritten atomically, the port and egress-default sets
// are replaced, and the slots set, the egress map and the slots' egress
// chains keep their contents, so the slots of a running workload never
// lose their connectivity, nor their policies, while the daemon restarts
// with another policy. A table found as Ensure would write it (its fixed
// rules all there, the first rule of chain egress naming the same layout:
// rules' version, policy, slot network, egress defaults) is left as it is:
// a restart then costs no transaction, whose commit would have the kernel
// walk every lease's chain.
//
// Element changes are batched: Add and Remove send all their elements in one
// nftables transaction (one netlink batch, split into several messages only
// because a netlink attribute is limited to 64 KiB); the egress chains a
// Remove takes go in transactions of at most 128, whose acknowledgements
// fit the netlink socket's buffer.
//
// A Table works in the network namespace of the calling process, or in the
// one given by WithNetNS (tests use it to install the ruleset in a namespace
// that plays the host).
package nft
