// Package shape holds a lease's bandwidth limits on the host side of its
// slot's link, where the slot's root cannot reach them.
//
// Into the slot is the host end's transmit: a tbf qdisc at the root of
// the host end. Out of the slot is the host end's receive, which no qdisc
// can hold back: an ingress qdisc on the host end redirects every packet
// (a u32 filter matching all, mirred) to an ifb device of the slot's own
// name (network/slot's Config.ShaperIfName), whose root is a tbf. A
// microVM's guest sends and receives through the same host end (its tap
// is inside the slot), so it is shaped the same; so is a CNI attachment,
// whose host end is the slot's.
//
// Why an ifb and not a policer, and the figures: docs/DESIGN.md, "Bandwidth
// limits". In short, a policer drops what exceeds the rate, where a tbf
// queues it, and this kernel (as many minimal ones) is built without
// act_police.
//
// The qdiscs die with the host end. The ifb does not: whoever deletes a
// slot's host end deletes its ifb too ([Clear], and network/slot's
// teardown, which finds it by name and deletes a batch's at once,
// [DeleteIfbs]).
//
// Rates are bits per second and bursts bits, as CNI's bandwidth
// capability and the kubelet give them; the kernel's tbf counts bytes on
// the wire (headers included).
package shape
