// Package slot defines a network slot and does the kernel work for one.
//
// It holds the configuration and its validation, naming and addressing,
// Create and Destroy of a slot, a survey of what exists on the host, and the
// batched teardown that reclaim, the pool and the reconciler share.
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
//
// What is ours is decided by name and kind. A name is ours when it is the
// prefix and an index written canonically (no sign, no leading zero), in
// [1, Slots] or beyond it: a run with a larger Config.Slots left those, and they
// are reclaimed and reported (ScanResult.Beyond), never handed out. A netns
// entry is ours only if it is a bound network namespace or an empty regular
// file; everything else at our names is a look-alike and never touched.
//
// Manager.Survey costs time linear in what it finds: one read of the netns
// directory and of mountinfo, one read of /proc/net/dev (an RTM_GETLINK dump
// costs O(N²) with N slots: the kernel looks up each veth peer's nsid with a
// linear walk), one dump of the set. Entries it cannot inspect are reported
// (ScanResult.Unreadable) and never torn down.
//
// Manager.Create clears the host's conntrack entries of the index's
// earlier slot before the new one can carry traffic, with a walk of the
// host's conntrack table shared by every index the manager knows has had
// no slot since a moment it observed (a Survey, a teardown, a Create's own
// check): one walk costs the same for one address or thousands, so
// creations do not pay one each.
//
// Manager.Attach gives a slot an inside end in a network namespace the
// slot does not own (a container's, for a CNI attachment), named and
// configured as the runtime asks: a new pair made in place, never a link
// moved (a move waits for the kernel's RCU callbacks while holding the
// networking lock). The slot's warm pair is parked (Config.ParkedIfName)
// and its own namespace stays as its identity; the new host end takes the
// slot's name, and with it the slot's firewall element and egress policy.
// Manager.Unplug cuts an attachment off at once (both ends down, the
// container's renamed) and leaves the pair to the teardown, which knows an
// attached slot by its parked end and deletes its host end rather than
// wait for the kernel; Manager.Detach deletes the host end at once.
//
// Manager.Teardown hands the kernel the dead namespaces all at once or in
// batches (TeardownOptions.Batch, BatchPause): the kernel's clean-up holds
// the networking lock while it destroys a batch, so smaller batches keep a
// concurrent Create from stalling, at some cost in total time. Paced
// (TeardownOptions.Pace), the next batch is unlinked while the kernel
// destroys the one before, which takes back most of that cost, unless
// TeardownOptions.Overlap says the process cannot spare it now.
package slot
