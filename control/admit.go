package control

import "github.com/phasegate/phasegate/server"

// Admit is the guard's policy as a server's Config.Admit, for a surface
// whose callers are all Unix peers (the control socket): a peer the policy
// grants nothing is refused at accept, before it holds any of the
// surface's connections, and a peer it grants something is permitted, to
// the connections the surface keeps for them (server.Limits'
// PermittedConns). Every call of a peer granted nothing would be refused
// anyway (PermissionDenied); held open, its connections would be taken
// from those the principals need. A connection whose credentials could
// not be read is refused too: every call on it would be Unauthenticated.
// The server asks it nothing of root, which is privileged.
func (g *Guard) Admit(cred *server.PeerCred) server.PeerClass {
	if cred == nil || g.policy.Grant(fromPeerCred(*cred)).Empty() {
		return server.PeerRefused
	}
	return server.PeerPermitted
}
