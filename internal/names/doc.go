// Package names is the one rule for the names a client gives the daemon
// and others read back.
//
// They are the owners and request ids of leases, the owner patterns of
// the control policy, and what a CNI attachment's key adds to them.
//
// A name is printable ASCII other than space, '"' and '\', from 1 to
// [MaxLen] bytes. Its canonical form is its bytes: it is stored, compared
// and answered exactly as the client sent it, and there is nothing to
// normalize, because a name whose look could differ from its bytes (an
// invisible or blank character, another script's letter, a combining mark,
// a fullwidth form, NFC against NFD) is refused, not mapped. Unicode is
// allowed nowhere today; a door that needs it declares its own rule here.
// docs/SECURITY.md ("Names") says why ASCII and not a PRECIS profile.
//
// A CNI attachment's key narrows the rule for its parts: a network's name
// and a container id follow the CNI spec's ([CheckCNIName]), an interface
// name the kernel's too ([CheckIfName]: at most 15 bytes, not "." or "..",
// no '/', ':' or '%'), so that the link the kernel makes bears the name
// recorded. The plugin, the daemon's CNI routes and the Slots API check a
// key with these alone (api/cni/v1's Key.Check).
//
// A refusal is an [*Error] naming the rule and the first code point that
// breaks it ("U+3164 ... outside ASCII (Lo, Hangul)"), and shows the name
// as [Shown] does, never raw. [Shown] is also how a name recorded before
// the rule, which keeps working, is written where people read it (logs,
// error messages); [ASCIIJSON] is how a JSON answer holding one is printed.
package names
