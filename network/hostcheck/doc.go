// Package hostcheck checks, at start, whether the host lets the slots' traffic
// out, and says what is missing in terms an operator can act on.
//
// Slot egress fails silently when the host is not set up for it: packets
// leave the slot, reach the host end of its veth and vanish. The usual
// causes, and what Check does about each:
//
//   - Forwarding is off: net.ipv4.ip_forward=0 (the kernel default), or
//     net.ipv4.conf.default.forwarding=0, which new interfaces (every slot's
//     host veth) inherit. Check reads both through rtnetlink (RTM_GETNETCONF,
//     the same values as the sysctls) in the namespace it checks; with
//     dual-stack slots (Config.IPv6) net.ipv6.conf.all.forwarding too.
//   - Another table drops forwarded packets. nftables runs every base chain
//     registered at a hook, in priority order, and a packet must survive all
//     of them: an accept ends only the chain it is in, a drop is final. The
//     slot table's accept therefore cannot override a forward chain with
//     policy drop elsewhere — Docker's `ip filter FORWARD` made through
//     iptables-nft is the common one — nor an unconditional drop rule in one.
//     Check lists every base chain at the forward hook (families ip and inet;
//     slots are IPv4) through nftables and reports those that drop slot
//     traffic. It recognises the rules that fix it: an accept matching
//     `iifname` with a wildcard covering the slots' host interfaces (for the
//     way out) and an accept on `ct state established,related` or on a
//     covering `oifname` (for the way back), in the chain itself or in a
//     chain it jumps to (Docker's DOCKER-USER). Conditional drop rules
//     (`ip saddr 10.0.0.0/8 drop`, `ct state invalid drop`) are not judged:
//     Check cannot know which packets they match.
//   - No masquerade: the slot table's postrouting chain is missing (the
//     kernel has no nat support for nftables: nft_chain_nat, nft_masq).
//   - No route out: the host has no IPv4 route for an address beyond its
//     own networks (a FIB lookup of a TEST-NET address; nothing is sent).
//
// What Check cannot see it says so rather than guess: iptables-legacy
// tables (listed in /proc/net/ip_tables_names) hook the same forward path
// with their own policy, which nftables does not show; Check reports that
// they exist and how to look. IPv6 forwarding is not checked: slots have
// no IPv6 addresses beyond link-local.
//
// Each Problem carries a Kind for callers that branch and a one-line
// Message that says what is wrong and the command that fixes it. The daemon
// logs them and raises a health warning; nothing here changes the host.
package hostcheck
