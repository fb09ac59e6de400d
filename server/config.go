package server

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"time"

	"google.golang.org/grpc"

	"github.com/phasegate/phasegate/health"
)

// Config configures a [Server]. Every duration means what it says: zero is
// no delay or no bound, like net/http's timeouts, and a negative one is
// refused by [New]; so is every bound of [Limits]. [DefaultConfig] has the
// recommended values.
type Config struct {
	// Addr is the TCP address to listen on, such as "127.0.0.1:0" or
	// ":7000". Ignored when Listener is set; empty when [Server.SetPort]
	// gives it once the owner knows it.
	Addr string
	// Listener, when set, is used instead of binding Addr (for example a
	// socket handed over by systemd). The server closes it at Drain. On a
	// Unix socket every connection carries its peer's credentials, read
	// from the kernel: [PeerCredFromContext] returns them to gRPC
	// interceptors, services and HTTP handlers.
	Listener net.Listener

	// SniffTimeout bounds how long a new connection may take to show
	// whether it speaks gRPC; a client that sends nothing is dropped after
	// it. Zero means no bound: a silent client keeps its connection (and a
	// goroutine) until it closes it or the server drains — a drain never
	// waits for it either way. Recommended: 5s.
	SniffTimeout time.Duration
	// ReadHeaderTimeout, ReadTimeout, WriteTimeout and IdleTimeout are the
	// HTTP server's (see net/http.Server). Zero means no bound; unlike
	// net/http, a zero ReadHeaderTimeout or IdleTimeout does not fall back
	// to ReadTimeout. Recommended: 5s, 30s, 60s and 2m.
	ReadHeaderTimeout time.Duration
	ReadTimeout       time.Duration
	WriteTimeout      time.Duration
	// IdleTimeout also closes a gRPC connection with no call in flight for
	// that long (GOAWAY first: grpc-go's MaxConnectionIdle); a client
	// reconnects for its next call.
	IdleTimeout time.Duration

	// Limits bound the connections and what one may send; see [Limits].
	Limits
	// Admit, when set, is asked at accept what the peer of a new
	// connection is, before the connection takes any share of the
	// Limits: a peer it refuses is closed at once, counted in
	// [ConnStats].RefusedAdmission; a permitted one may use
	// PermittedConns. It is how a surface whose callers must be known
	// (a control socket with a policy) keeps the rest from holding
	// connections there. cred is the kernel's record of a Unix socket's
	// peer, nil for a TCP connection or when it could not be read. It is
	// not asked about uid 0 or the server's own user, which are always
	// privileged. It runs on the accept loop: it must be quick and must
	// not block. Nil: every other peer is ordinary.
	Admit func(cred *PeerCred) PeerClass
	// Logger receives what the server decides on its own: connections
	// refused over a bound, accepts that failed for want of resources,
	// each kind at most once a second with the count since its last line.
	// Nil discards them; [Server.ConnStats] counts them all the same.
	Logger *slog.Logger

	// DrainDelay is how long Drain waits, with health already NOT_SERVING
	// and new application calls refused, before it stops the servers: time
	// for in-flight calls to finish and for checkers to see the change.
	// Zero means no delay. Recommended: 5s, or a little more than the
	// interval of the slowest checker.
	DrainDelay time.Duration
	// StopTimeout bounds the graceful stop of the gRPC and HTTP servers
	// after the delay; what is left then is closed. Zero means no bound of
	// the server's own: the graceful stop lasts until it ends or the ctx
	// given to Drain does. Recommended: 10s.
	StopTimeout time.Duration

	// GRPCOptions are passed to grpc.NewServer: interceptors, stats
	// handlers, credentials, limits.
	GRPCOptions []grpc.ServerOption
	// Health, when set, is registered as grpc.health.v1, its HTTP
	// endpoints are mounted (/health, /livez, /readyz, /startupz), declared
	// services are reported through it, and Drain shuts it down first and
	// closes it (ending Watch streams) before stopping gRPC.
	Health *health.Checker
	// Gate decides whether calls to declared services and requests to
	// declared HTTP routes may be dispatched; usually [LifecycleGate]. Nil
	// means open once bound.
	Gate Gate
	// DisableReflection leaves gRPC server reflection out.
	DisableReflection bool

	// TLS, when set, makes every connection TLS. It is terminated before
	// the multiplexer, so gRPC and HTTP share the certificate and the port;
	// ALPN gives gRPC clients h2 and everyone else http/1.1.
	TLS *tls.Config
	// RequireClientCert makes declared services and declared HTTP routes
	// accept only calls that presented a client certificate verified
	// against TLS.ClientCAs (codes.Unauthenticated, or HTTP 403, otherwise).
	// Health, reflection and the other HTTP endpoints stay open to
	// checkers, which present none.
	RequireClientCert bool
}

// DefaultConfig returns the recommended bounds and delays, without an
// address: a daemon starts from it, sets Addr or Listener and overrides
// what its flags say.
func DefaultConfig() Config {
	return Config{
		SniffTimeout:      5 * time.Second,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      60 * time.Second,
		IdleTimeout:       2 * time.Minute,
		Limits:            DefaultLimits(),
		DrainDelay:        5 * time.Second,
		StopTimeout:       10 * time.Second,
	}
}

// validate reports every field that cannot be used, joined.
func (c Config) validate() error {
	var errs []error
	for _, f := range []struct {
		name string
		d    time.Duration
	}{
		{"SniffTimeout", c.SniffTimeout},
		{"ReadHeaderTimeout", c.ReadHeaderTimeout},
		{"ReadTimeout", c.ReadTimeout},
		{"WriteTimeout", c.WriteTimeout},
		{"IdleTimeout", c.IdleTimeout},
		{"DrainDelay", c.DrainDelay},
		{"StopTimeout", c.StopTimeout},
	} {
		if f.d < 0 {
			errs = append(errs, fmt.Errorf("server: Config.%s is %v, must not be negative (zero means none)", f.name, f.d))
		}
	}
	errs = append(errs, c.Limits.validate()...)
	return errors.Join(errs...)
}

// noBound turns this package's "zero is no bound" into net/http's, where a
// zero ReadHeaderTimeout or IdleTimeout falls back to ReadTimeout and only a
// negative one is no bound.
func noBound(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// PeerClass is what [Config.Admit] says of a connection's peer: which
// share of the [Limits] it may use, or none.
type PeerClass uint8

const (
	// PeerOrdinary is bound by MaxConnsPerPeer, and ordinary peers
	// together by MaxConns less PrivilegedConns and PermittedConns.
	PeerOrdinary PeerClass = iota
	// PeerPermitted is bound by MaxConnsPerPeer, and unprivileged peers
	// together by MaxConns less PrivilegedConns: PermittedConns of that
	// are kept from ordinary peers.
	PeerPermitted
	// PeerPrivileged is bound by MaxConns alone, as uid 0 and the
	// server's own user are.
	PeerPrivileged
	// PeerRefused is closed at accept.
	PeerRefused
)

func (c PeerClass) String() string {
	switch c {
	case PeerOrdinary:
		return "ordinary"
	case PeerPermitted:
		return "permitted"
	case PeerPrivileged:
		return "privileged"
	case PeerRefused:
		return "refused"
	}
	return "PeerClass(" + strconv.Itoa(int(c)) + ")"
}
