// Package account counts what a lease's slot carries, each way, from the
// kernel's counters of its host link.
//
// The [Ledger] carries them across the links a lease has, so that a
// lease's totals never go back while it lives.
//
// # Where the counts come from
//
// Every packet into or out of a slot crosses the host end of its veth pair
// (a microVM's guest behind its tap, and a container's namespace after a
// CNI ADD, too). The kernel counts each device's bytes and packets
// already, so counting costs the datapath nothing: no rule, no counter
// expression, no per-packet work beyond what the device does anyway. The
// host end's transmit is what went into the slot (In), its receive what
// came out of it (Out); the slot's root cannot reach them.
//
// A link's counters start at zero when it is made and stay while it
// lives, across daemon restarts and upgrades. They go back only when the
// link is made again (the daemon repairing a host link deleted from
// outside): [Ledger] carries what the earlier links counted, as last
// seen, into the lease's totals.
//
// # Reading them
//
// [OfLink] reads one link's counters (one RTM_GETLINK), for a Get and a
// release. [ReadNetDev] reads every link's at once from /proc/net/dev,
// for a List and the reconciler's pass, which reads that file anyway: not
// an RTM_GETLINK dump, which costs O(N²) with N slots (network/slot).
package account
