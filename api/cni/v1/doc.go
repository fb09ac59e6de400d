// Package cniv1 is the wire between the CNI plugin and the daemon: one JSON
// request and answer per call, as HTTP/1.0 on the control socket.
//
// The calls go through the same guard as the Slots API (the caller's
// principal from SO_PEERCRED, the control policy, the rate, the audit
// line).
//
// The plugin is exec'd by a container runtime once per call, so what it
// links is paid at every ADD and DEL: this package imports nothing beyond
// the standard library's net, encoding/json and what they pull in, and
// writes the request and reads the answer itself instead of linking
// net/http (docs/BENCHMARKS.md, "The CNI plugin's exec cost"). HTTP/1.0
// keeps that reading to a status line, headers and a body to the end of
// the connection: no chunks, no keep-alive. The daemon serves these
// routes with net/http, so curl --unix-socket speaks them too.
//
// An attachment is keyed by its [Key], the (network, container id,
// ifname) triple of the CNI spec; the daemon holds it as a lease of owner
// "cni/<network>" (see [Key.Owner]). [Key.Check] is the one rule for a new
// key, which the plugin, the daemon and the Slots API apply alike.
//
// ADD and CHECK pass the container's network namespace open
// ([Client.File]): the plugin opens CNI_NETNS with its own credentials and
// the daemon acts on that descriptor, never opening a path for a caller
// but root (docs/DESIGN.md §11).
package cniv1
