package control

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/phasegate/phasegate/server"
)

// Kind says how a [Principal] was identified.
type Kind uint8

const (
	// Unix: a peer on the Unix socket, named by the kernel.
	Unix Kind = iota + 1
	// Certificate: a TLS client whose certificate the configured CA
	// verified.
	Certificate
)

// Principal is who makes a call, as the transport proved it: never what
// the caller says of itself.
type Principal struct {
	Kind Kind
	// Unix: the peer's uid, primary gid, supplementary groups and pid
	// when it connected.
	UID, GID uint32
	Groups   []uint32
	PID      int32
	// Certificate: the identity of the verified client certificate: its
	// first URI SAN (a SPIFFE ID), else its first DNS SAN, else its
	// subject's common name.
	Identity string
}

// String names the principal the way leases record it and policies and
// logs show it: "uid:1000", or "x509:spiffe://cluster/ns/a/sa/b".
func (p Principal) String() string {
	switch p.Kind {
	case Unix:
		return "uid:" + strconv.FormatUint(uint64(p.UID), 10)
	case Certificate:
		return "x509:" + p.Identity
	}
	return "anonymous"
}

// IsRoot reports whether p is uid 0 on the Unix socket.
func (p Principal) IsRoot() bool { return p.Kind == Unix && p.UID == 0 }

// inGroup reports whether p is in group gid (primary or supplementary).
func (p Principal) inGroup(gid uint32) bool {
	return p.Kind == Unix && server.PeerCred{GID: p.GID, Groups: p.Groups}.InGroup(gid)
}

// ErrUnauthenticated is wrapped by every error [Identify] returns.
var ErrUnauthenticated = errors.New("unauthenticated")

// Identify returns the principal of a gRPC call: the kernel's record of a
// Unix socket peer, or the identity of a verified client certificate.
// Anything else — a TCP client without a certificate — is refused.
func Identify(ctx context.Context) (Principal, error) {
	if pc, ok := server.PeerCredFromContext(ctx); ok {
		return fromPeerCred(pc), nil
	}
	if p, ok := peer.FromContext(ctx); ok {
		if info, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(info.State.VerifiedChains) > 0 {
			return fromCertificate(info.State.VerifiedChains[0][0])
		}
	}
	return Principal{}, errNoCredentials
}

// IdentifyRequest is [Identify] for an HTTP request.
func IdentifyRequest(r *http.Request) (Principal, error) {
	if pc, ok := server.PeerCredFromContext(r.Context()); ok {
		return fromPeerCred(pc), nil
	}
	if r.TLS != nil && len(r.TLS.VerifiedChains) > 0 {
		return fromCertificate(r.TLS.VerifiedChains[0][0])
	}
	return Principal{}, errNoCredentials
}

var (
	errNoCredentials = fmt.Errorf("%w: no credentials: over TCP the control surface needs a client certificate signed by the daemon's --tls-client-ca; on the host, use the control socket", ErrUnauthenticated)
	errNoIdentity    = fmt.Errorf("%w: the client certificate names no identity (no URI SAN, DNS SAN or common name)", ErrUnauthenticated)
)

func fromPeerCred(pc server.PeerCred) Principal {
	return Principal{Kind: Unix, UID: pc.UID, GID: pc.GID, Groups: pc.Groups, PID: pc.PID}
}

// fromCertificate names a verified leaf certificate.
func fromCertificate(c *x509.Certificate) (Principal, error) {
	var id string
	switch {
	case len(c.URIs) > 0:
		id = c.URIs[0].String()
	case len(c.DNSNames) > 0:
		id = c.DNSNames[0]
	case c.Subject.CommonName != "":
		id = c.Subject.CommonName
	default:
		return Principal{}, errNoIdentity
	}
	return Principal{Kind: Certificate, Identity: id}, nil
}

// KindOf returns the kind of a principal as leases record it
// ([Principal.String]): Unix for "uid:…", Certificate for "x509:…", zero
// for anything else.
func KindOf(recorded string) Kind {
	switch {
	case strings.HasPrefix(recorded, "uid:"):
		return Unix
	case strings.HasPrefix(recorded, "x509:"):
		return Certificate
	}
	return 0
}
