// Package inside writes the nftables tables that live inside one slot's
// network namespace.
//
// It writes the NAT between a microVM guest's fixed address and the slot's
// own inside address, and the egress policy of the slot's lease. Both are
// tables of the namespace, not of the host, so they go with the namespace
// when the slot is destroyed and need no per-slot state on the host; a
// restart of the daemon finds them where the slot is.
//
// Two tables, each written in one netlink batch (one nf_tables
// transaction, which the kernel commits whole or not at all):
//
//   - ip phasegate_guest: chain pre (nat, prerouting) translates what
//     arrives on the uplink (eth0) for the slot's inside address to the
//     guest's address; chain post (nat, postrouting) translates what the
//     guest sends out of the uplink to the inside address. Every slot's
//     guest has the same address; the host and the outside see each at
//     its slot's own.
//   - inet phasegate_egress: base chains fwd (filter, forward) and out
//     (filter, output) jump to chain policy for every packet leaving
//     through the uplink; chain policy accepts established and related
//     traffic, then the daemon's always-allowed set, then drops (deny-all
//     mode), then accepts the lease's allow set, drops its deny set, drops
//     the daemon's always-denied set, and accepts the rest. Drops go
//     through one named counter, egress_drops, which a replacement keeps.
//     Chains proxy_pre and proxy_out (nat) send new TCP connections to an
//     egress proxy on the host when the policy asks for it.
//
// ApplyPolicy replaces the sets' elements and the policy chain's rules in
// the same batch (flush and add), so a packet meets the old policy or the
// new one and never a mix, and connections the old policy let through stay
// up: conntrack, not the rules, carries them (established is accepted
// first). The first rule of chain policy carries the policy's fingerprint
// in its comment: Inspect reads it back, and a restart compares it with
// the lease's record to leave an intact policy untouched.
//
// Everything works through a descriptor of the namespace
// (nftables.WithNetNSFd): no thread changes namespace.
//
// The policy itself (its lists, its check, its fingerprint, what it lets
// out) is package egress's; this package writes it.
package inside
