package server

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"slices"

	"github.com/soheilhy/cmux"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// tlsConfig prepares the server's TLS configuration: TLS is terminated on
// the raw connection, before the multiplexer, so gRPC and HTTP share one
// certificate and one port.
//
// The multiplexer tells gRPC from HTTP by speaking HTTP/2 first, which only
// gRPC clients can answer: an HTTP client that negotiated h2 would receive
// an extra SETTINGS frame and fail. So ALPN picks h2 only for clients that
// offer nothing else — gRPC clients offer just "h2" — and http/1.1 for every
// client that offers it (browsers, curl, kubelet, Consul, Nomad).
func tlsConfig(base *tls.Config, requireClientCert bool) (*tls.Config, error) {
	if base == nil {
		if requireClientCert {
			return nil, errors.New("server: RequireClientCert needs a TLS configuration")
		}
		return nil, nil
	}
	cfg := base.Clone()
	if requireClientCert {
		if cfg.ClientCAs == nil {
			return nil, errors.New("server: RequireClientCert needs TLS.ClientCAs")
		}
		// Health checkers present no certificate; application calls are
		// refused without one in admit.
		if cfg.ClientAuth < tls.VerifyClientCertIfGiven {
			cfg.ClientAuth = tls.VerifyClientCertIfGiven
		}
	}
	if cfg.MinVersion < tls.VersionTLS12 {
		cfg.MinVersion = tls.VersionTLS12
	}
	cfg.NextProtos = []string{"h2", "http/1.1"}
	perConn := cfg.Clone()
	cfg.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
		c := perConn
		if slices.Contains(hello.SupportedProtos, "http/1.1") || len(hello.SupportedProtos) == 0 {
			c = perConn.Clone()
			c.NextProtos = []string{"http/1.1"}
		}
		return c, nil
	}
	return cfg, nil
}

// terminatedTLS is the gRPC transport security of a server whose TLS was
// terminated before the multiplexer: it does no handshake, and reports the
// finished one so that interceptors and [Server] see the peer's
// certificate as with grpc-go's own TLS credentials.
type terminatedTLS struct{}

func (terminatedTLS) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	tc := tlsConnOf(c)
	if tc == nil {
		return nil, nil, errors.New("server: connection is not TLS")
	}
	return c, credentials.TLSInfo{
		State:          tc.ConnectionState(),
		CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity},
	}, nil
}

func (terminatedTLS) ClientHandshake(context.Context, string, net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("server: terminatedTLS is server-side only")
}

func (terminatedTLS) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "tls", SecurityVersion: "1.2"}
}

func (terminatedTLS) Clone() credentials.TransportCredentials { return terminatedTLS{} }

func (terminatedTLS) OverrideServerName(string) error { return nil }

// tlsConnOf finds the TLS connection under the multiplexer's wrapper.
func tlsConnOf(c net.Conn) *tls.Conn {
	for {
		switch v := c.(type) {
		case *tls.Conn:
			return v
		case *cmux.MuxConn:
			c = v.Conn
		default:
			return nil
		}
	}
}

// rawConnOf finds the accepted TCP connection under the multiplexer's and
// TLS's wrappers.
func rawConnOf(c net.Conn) net.Conn {
	for {
		switch v := c.(type) {
		case *tls.Conn:
			c = v.NetConn()
		case *cmux.MuxConn:
			c = v.Conn
		default:
			return c
		}
	}
}

// checkClientCert refuses an application call whose peer presented no
// verified client certificate.
func checkClientCert(ctx context.Context, service string) error {
	p, ok := peer.FromContext(ctx)
	if ok {
		if info, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(info.State.VerifiedChains) > 0 {
			return nil
		}
	}
	return status.Errorf(codes.Unauthenticated, "%s requires a client certificate signed by the configured CA", service)
}
