// Package egress is a lease's egress policy: what a slot may send out of
// its uplink, and the daemon's part of every policy (Defaults).
//
// It is the policy's one home. Policy is the one type every other package
// takes: the Slots API's message, a lease's record and the CNI plugin's
// wire policy are each parsed by FromMessage (a Message: the four fields
// they share), checked once (Parse, Validate; Defaults.Admit for what the
// daemon can write), and fingerprinted once (Fingerprint, which the host's
// table and the slot's own table carry in their first rule so that a
// restart leaves an intact policy unwritten). Package nft writes a policy
// as a slot's chain in the host's table, package inside as the slot's own
// table; neither parses nor checks one.
//
// What a policy lets a slot send, read from the host's rules, orders
// policies: Within says whether one lets out nothing another does not,
// and Narrow computes the policy that lets out exactly what two do (a
// network's policy as the ceiling of a container's own). Both work on
// Ranges, the merged intervals a policy's lists are written as.
//
// The next field of a policy (destinations by DNS name, issue 47) is a
// field of Policy: parsed, checked, fingerprinted and converted here, and
// written by nft and inside, with no other type to add it to.
package egress
