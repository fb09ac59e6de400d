// Package hostwatch tells when the host's network changes: its links,
// IPv4 addresses and routes, the caller's own links left out.
//
// What the daemon reads of the host at its start (the addresses and routes
// its slot CIDR must not overlap, what the slots' egress needs of the
// host) is a snapshot: a host gains an uplink, a VPN or a CNI bridge after
// the start. [Watch] listens to rtnetlink's link, IPv4 address and IPv4
// route groups on one socket, leaves out what happens on the daemon's own
// links (the slots' host ends, made and deleted all day), and calls back
// once a burst of changes has settled, so that the caller reads the host
// again.
//
// A change on a link is the daemon's own when the link's name says so
// ([Options.Ours]); an address or a route names its link by index only,
// which is looked up by name once (SIOCGIFNAME, not an RTM_GETLINK, whose
// answer for a veth costs a walk of the namespace's peer ids) and kept
// until the link goes. A change whose link cannot be named (gone by
// then) counts as the host's: reading the host again is never wrong.
package hostwatch
