// Package control guards a daemon's control surface: who is calling, what
// they may do, how often, and a record of what they did.
//
// A daemon serves two surfaces. The public port carries what checkers and
// operators read — health, metrics, the phase views — and nothing there
// names a tenant or changes anything. The control surface carries the API
// that changes things (phasegate's Slots API). It is a Unix socket by
// default ([Listen]: mode 0660, a group chosen by the operator), where the
// kernel names the caller (SO_PEERCRED, read by package server); over TCP
// it exists only with mutual TLS, where the caller is its verified client
// certificate, named by its URI SAN, DNS SAN or common name, three kinds of
// principal that never match one another. [Identify] turns either into a
// [Principal].
//
// An [AccessPolicy] maps principals — a uid, a gid or group, a certificate
// identity — to a [Grant]: the owners they may lease for (exact names or
// prefixes), read-only or not, and a quota of leases. Root on the socket
// may do everything; nothing else may do anything unless the policy says
// so.
//
// A [Guard] is the gRPC interceptor in front of the API: it identifies the
// caller, applies its rate limit, refuses a caller the policy grants
// nothing, hands the service the [Caller] to authorize each call against,
// and writes one audit line per mutating call, allowed or refused, with a
// metric by outcome. The service adds what the audit line names (the
// owner, the slot) with [Note]. Where every caller is a principal (the
// Unix socket), [Guard.Tap], [Guard.InterceptStream] and [Guard.HTTP] put
// every route under the same rate: each gRPC call of any method before its
// request is read, each further message of a stream, each HTTP request.
//
// The package knows nothing of slots: a service of any daemon that leases
// things to owners can use it.
package control
