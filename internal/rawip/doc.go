// Package rawip builds and sends IP packets with addresses of the caller's
// choosing.
//
// It makes what a tenant holding CAP_NET_RAW in its namespace, or a microVM
// guest writing frames on its tap, can put on the wire. Tests of the
// anti-spoofing rules use it as the attacker; nothing in the daemon does.
package rawip
