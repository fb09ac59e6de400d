// Package nft manages the host firewall state of network slots: one nftables
// table per slot prefix (family inet) holding a set of interface names and a
// fixed handful of rules that forward and masquerade by set lookup. Adding or
// removing a slot is one set-element change; the rule count never grows with
// the number of slots.
//
// The table looks like this in `nft list table inet <name>`:
//
//	table inet <name> {
//		set slots { type ifname }
//		chain forward { type filter hook forward priority filter; policy accept;
//			iifname @slots accept
//			oifname @slots ct state established,related accept }
//		chain postrouting { type nat hook postrouting priority srcnat; policy accept;
//			iifname @slots oifname != @slots masquerade }
//	}
//
// Element changes are batched: Add and Remove send all their elements in one
// nftables transaction (one netlink batch, split into several messages only
// because a netlink attribute is limited to 64 KiB).
package nft
