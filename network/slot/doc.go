// Package slot defines a network slot and does the kernel work for one:
// configuration and its validation, naming and addressing, Create and
// Destroy of a slot, a scan of what exists on the host, and the batched
// teardown that reclaim, the pool and the reconciler share.
//
// Slot i (1 ≤ i ≤ Config.Slots) is:
//   - the netns file <NetnsDir>/<Prefix><i>, made the iproute2 way;
//   - a veth pair: <Prefix>h<i> in the root namespace and eth0 inside;
//   - the i-th /31 of Config.CIDR: the host end gets the even address, eth0
//     the odd one; both links and lo are up; the default route inside goes
//     via the host end;
//   - the host end's name as an element of the set of the per-prefix
//     nftables table (see package nft).
//
// An index is free only when its netns file, its host link and its set
// element are all gone.
package slot
