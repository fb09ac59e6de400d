// Package iperf measures TCP throughput between two network namespaces
// with iperf3, as the bits a link's shaper counts.
//
// The tests of bandwidth limits use it: the network package's, on a slot
// made alone, and the end-to-end ones, on a daemon's slot in a node's
// namespace; nothing in the daemon does.
package iperf
