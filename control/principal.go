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

// Kind says how a [Principal] was identified. A certificate's identity
// is one of three kinds, never confused with one another: a URI SAN, a
// DNS SAN and a common name may be the same string, and name three
// different principals.
type Kind uint8

const (
	// Unix: a peer on the Unix socket, named by the kernel: "uid:1000".
	Unix Kind = iota + 1
	// URISAN: a TLS client named by its verified certificate's first URI
	// SAN (a SPIFFE ID): "x509:uri:spiffe://example.org/ns/ci/sa/builder".
	URISAN
	// DNSSAN: a TLS client whose certificate has no URI SAN, named by its
	// first DNS SAN: "x509:dns:builder.example.org".
	DNSSAN
	// CommonName: a TLS client whose certificate has no SAN of either
	// kind, named by its subject's common name: "x509:cn:sandbox-scheduler".
	CommonName
)

// word names a certificate kind in a principal ("x509:uri:…") and in a
// policy's identity pattern ("uri:…"); "" for any other kind.
func (k Kind) word() string {
	switch k {
	case URISAN:
		return "uri"
	case DNSSAN:
		return "dns"
	case CommonName:
		return "cn"
	}
	return ""
}

// Certificate reports whether k names a TLS client by its certificate.
func (k Kind) Certificate() bool { return k.word() != "" }

// Principal is who makes a call, as the transport proved it: never what
// the caller says of itself.
type Principal struct {
	Kind Kind
	// Unix: the peer's uid, primary gid, supplementary groups and pid
	// when it connected.
	UID, GID uint32
	Groups   []uint32
	PID      int32
	// URISAN, DNSSAN, CommonName: the identity of the verified client
	// certificate, of that kind: its first URI SAN, else its first DNS
	// SAN, else its subject's common name.
	Identity string
}

// String names the principal the way leases record it and policies and
// logs show it: "uid:1000", or "x509:" and the certificate identity's kind
// and value ("x509:uri:spiffe://cluster/ns/a/sa/b", "x509:cn:scheduler").
func (p Principal) String() string {
	if p.Kind == Unix {
		return "uid:" + strconv.FormatUint(uint64(p.UID), 10)
	}
	if w := p.Kind.word(); w != "" {
		return "x509:" + w + ":" + p.Identity
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
	switch {
	case len(c.URIs) > 0:
		return Principal{Kind: URISAN, Identity: c.URIs[0].String()}, nil
	case len(c.DNSNames) > 0:
		return Principal{Kind: DNSSAN, Identity: c.DNSNames[0]}, nil
	case c.Subject.CommonName != "":
		return Principal{Kind: CommonName, Identity: c.Subject.CommonName}, nil
	}
	return Principal{}, errNoIdentity
}

// KindOf returns the kind of a principal as leases record it
// ([Principal.String]): Unix for "uid:…", URISAN, DNSSAN or CommonName for
// "x509:uri:…", "x509:dns:…" and "x509:cn:…", zero for anything else.
func KindOf(recorded string) Kind {
	if strings.HasPrefix(recorded, "uid:") {
		return Unix
	}
	if rest, ok := strings.CutPrefix(recorded, "x509:"); ok {
		for _, k := range []Kind{URISAN, DNSSAN, CommonName} {
			if strings.HasPrefix(rest, k.word()+":") {
				return k
			}
		}
	}
	return 0
}
