package server

import (
	"fmt"
	"math"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
)

// Limits bound what the peers of a [Server] can take of it: its
// connections, whose descriptors and memory are the process's, and what
// one connection may send. A connection over a connection bound is closed
// as soon as it is accepted (a TCP one with a reset), counted in
// [ConnStats] and logged at most once a second; the server keeps
// accepting. Zero in a field means no bound. [DefaultLimits] has the
// recommended values.
type Limits struct {
	// MaxConns bounds the connections open at once, every peer's
	// together: accepted and not yet closed, whether still being sniffed,
	// served or idle. It is what keeps a flood from taking the descriptors
	// the rest of the process needs.
	MaxConns int
	// MaxConnsPerPeer bounds the connections of one unprivileged peer. A
	// peer is a local user — its uid, as the kernel recorded it when it
	// connected (SO_PEERCRED on a Unix socket; for a TCP connection from
	// this host's network namespace, the owner of the other end's socket,
	// found with sock_diag) —, or for a TCP peer elsewhere its IPv4
	// address or its IPv6 /64. On loopback every local user has an
	// address (all of 127.0.0.0/8): the uid is what tells them apart.
	MaxConnsPerPeer int
	// PrivilegedConns is the part of MaxConns that unprivileged peers
	// together may not take: it is kept for privileged peers, uid 0 and
	// the server's own user (they could stop the process anyway), which
	// are not bound by MaxConnsPerPeer but only by MaxConns. A flood by
	// other users leaves the operator's tools, the self-probe ([Server.Alive])
	// and root's calls this many connections. At most MaxConns.
	PrivilegedConns int
	// PermittedConns is the part of MaxConns, beside PrivilegedConns,
	// that ordinary peers together may not take: it is kept for the peers
	// [Config.Admit] says are permitted, each still bound by
	// MaxConnsPerPeer. Peers a surface knows (its tenants) so keep
	// connections that peers it merely lets connect cannot take. Without
	// Admit every peer is ordinary and the share goes unused: leave it
	// zero. At most MaxConns less PrivilegedConns.
	PermittedConns int

	// MaxRecvMsgSize bounds a gRPC message the server receives, in
	// bytes: a larger one is refused with ResourceExhausted once its
	// length is read, before its body. It bounds the memory one call in
	// flight can hold, and so, with MaxConcurrentStreams and the
	// connection bounds, what a flood of big messages can. Zero is
	// grpc-go's own bound, 4 MiB.
	MaxRecvMsgSize int
	// MaxConcurrentStreams bounds the gRPC calls in flight on one
	// connection (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS): a client waits
	// for one to end before it starts another. Zero is no bound.
	MaxConcurrentStreams uint32
	// Window fixes the HTTP/2 flow-control window of a gRPC call and of a
	// connection, in bytes (at least 64 KiB): what a peer may send that
	// the server has not read yet. Zero lets grpc-go grow both with its
	// bandwidth estimate, up to 16 MiB a connection: what a bulk transfer
	// over a long path wants, and what lets a peer whose calls are refused
	// unread (over MaxRecvMsgSize, or without the credentials a service
	// needs) still push megabytes of each call before the refusal stops
	// it.
	Window int32
	// MaxHeaderBytes bounds a request's headers: an HTTP request's
	// (net/http's MaxHeaderBytes) and a gRPC call's metadata (HTTP/2
	// SETTINGS_MAX_HEADER_LIST_SIZE). Zero is each library's own bound:
	// 1 MiB for HTTP, 16 MiB for gRPC.
	MaxHeaderBytes int

	// MaxSniffBytes bounds what the server reads of a connection before
	// it knows whether the connection speaks gRPC or HTTP, in bytes as
	// they come off the wire (a TLS handshake included): what the
	// multiplexer keeps to replay to the server it hands the connection
	// to. A connection that needs more is closed unserved. An HTTP/1
	// request needs one byte (one TLS record over TLS), a gRPC call its
	// first HEADERS frames, so at least MaxHeaderBytes plus a TLS
	// handshake lets any call the gRPC server would take through. Zero
	// is no bound.
	MaxSniffBytes int
	// MaxSniffing bounds the connections of unprivileged peers accepted
	// and not yet handed to the gRPC or the HTTP server, all of them
	// together: with MaxSniffBytes, it bounds the memory they hold,
	// however many connections the other bounds let in. The same part of
	// it as PermittedConns is of MaxConns is kept for permitted peers. A
	// connection over it is closed at accept. Privileged peers (uid 0,
	// the server's own user) are not counted: they could stop the process
	// anyway, and their checkers' connections, which a starved machine
	// may keep in the decision for a while, must be answered late rather
	// than refused. Zero is no bound.
	MaxSniffing int
	// MaxSniffingPerPeer bounds the connections of one unprivileged
	// peer that are being sniffed at once: a client's connection is
	// sniffed for a round trip, a flood's for up to SniffTimeout. Zero is
	// no bound.
	MaxSniffingPerPeer int
}

// Defaults of [DefaultLimits].
const (
	// DefaultMaxConns bounds MaxConns whatever the descriptor limit: a
	// held connection costs the server tens of kilobytes of memory
	// (docs/BENCHMARKS.md, "Figures behind the network code"), and no
	// health port needs more than a few hundred.
	DefaultMaxConns = 4096
	// DefaultMaxConnsPerPeer is more than any checker, scraper or client
	// holds at once.
	DefaultMaxConnsPerPeer = 64
	// DefaultPrivilegedConns is the share kept for uid 0 and the server's
	// own user.
	DefaultPrivilegedConns = 64
	// DefaultMaxConcurrentStreams is HTTP/2's recommended least value.
	DefaultMaxConcurrentStreams = 100
	// DefaultMaxHeaderBytes is far above any checker's or client's
	// headers and tracing metadata.
	DefaultMaxHeaderBytes = 64 << 10
	// DefaultMaxRecvMsgSize is grpc-go's own bound; a daemon whose
	// messages are small sets its own.
	DefaultMaxRecvMsgSize = 4 << 20
	// DefaultMaxSniffBytes lets a first gRPC call with DefaultMaxHeaderBytes
	// of metadata through, and a TLS handshake with a client
	// certificate's chain before it.
	DefaultMaxSniffBytes = DefaultMaxHeaderBytes + 16<<10
	// DefaultMaxSniffing is what a port takes of new connections at once
	// before it knows their protocol: they hold at most 10 MiB of what
	// they sent (docs/SECURITY.md, "Bounds of the two surfaces").
	DefaultMaxSniffing = 128
	// DefaultMaxSniffingPerPeer is more than any client opens in one
	// round trip.
	DefaultMaxSniffingPerPeer = 16
)

// DefaultLimits returns the recommended limits for a process whose
// descriptor limit is the current soft RLIMIT_NOFILE: MaxConns is half of
// it (the other half is the process's own work), at most
// [DefaultMaxConns]. A daemon that knows what its own work needs computes
// MaxConns from it instead.
func DefaultLimits() Limits {
	var rl unix.Rlimit
	soft := uint64(2 * DefaultMaxConns)
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err == nil {
		soft = rl.Cur
	}
	return LimitsFor(int(min(soft/2, DefaultMaxConns)))
}

// LimitsFor returns the recommended limits with MaxConns set to maxConns:
// the per-peer bounds and the privileged share are scaled down when
// maxConns is small, so that one peer never takes more than a quarter of
// it (an eighth of it being sniffed) and the privileged share is an eighth
// at most.
func LimitsFor(maxConns int) Limits {
	return Limits{
		MaxConns:             maxConns,
		MaxConnsPerPeer:      max(1, min(DefaultMaxConnsPerPeer, maxConns/4)),
		PrivilegedConns:      min(DefaultPrivilegedConns, maxConns/8),
		MaxRecvMsgSize:       DefaultMaxRecvMsgSize,
		MaxConcurrentStreams: DefaultMaxConcurrentStreams,
		MaxHeaderBytes:       DefaultMaxHeaderBytes,
		MaxSniffBytes:        DefaultMaxSniffBytes,
		MaxSniffing:          min(DefaultMaxSniffing, maxConns),
		MaxSniffingPerPeer:   max(1, min(DefaultMaxSniffingPerPeer, maxConns/8)),
	}
}

// validate reports every field that cannot be used.
func (l Limits) validate() []error {
	var errs []error
	for _, f := range []struct {
		name string
		v    int
	}{
		{"MaxConns", l.MaxConns}, {"MaxConnsPerPeer", l.MaxConnsPerPeer}, {"PrivilegedConns", l.PrivilegedConns},
		{"PermittedConns", l.PermittedConns},
		{"MaxRecvMsgSize", l.MaxRecvMsgSize}, {"MaxHeaderBytes", l.MaxHeaderBytes},
		{"MaxSniffBytes", l.MaxSniffBytes}, {"MaxSniffing", l.MaxSniffing}, {"MaxSniffingPerPeer", l.MaxSniffingPerPeer},
	} {
		if f.v < 0 {
			errs = append(errs, fmt.Errorf("server: Config.%s is %d, must not be negative (zero means none)", f.name, f.v))
		}
	}
	if l.MaxConns > 0 && l.PrivilegedConns > l.MaxConns {
		errs = append(errs, fmt.Errorf("server: Config.PrivilegedConns %d is more than MaxConns %d", l.PrivilegedConns, l.MaxConns))
	} else if l.MaxConns > 0 && l.PermittedConns > l.MaxConns-l.PrivilegedConns {
		errs = append(errs, fmt.Errorf("server: Config.PermittedConns %d is more than MaxConns %d less PrivilegedConns %d", l.PermittedConns, l.MaxConns, l.PrivilegedConns))
	}
	if l.MaxSniffBytes > 0 && l.MaxSniffBytes < minSniffBytes {
		errs = append(errs, fmt.Errorf("server: Config.MaxSniffBytes %d is below %d, what HTTP/2's preface and first frames take", l.MaxSniffBytes, minSniffBytes))
	}
	if l.Window != 0 && l.Window < 64<<10 {
		errs = append(errs, fmt.Errorf("server: Config.Window %d is below HTTP/2's 64 KiB", l.Window))
	}
	if l.MaxHeaderBytes > math.MaxUint32 {
		errs = append(errs, fmt.Errorf("server: Config.MaxHeaderBytes %d does not fit HTTP/2's 32 bits", l.MaxHeaderBytes))
	}
	return errs
}

// minSniffBytes is the least MaxSniffBytes: HTTP/2's client preface, a
// SETTINGS frame, a WINDOW_UPDATE and a HEADERS frame of a small call.
const minSniffBytes = 1 << 10

// keepaliveEnforcement is grpc-go's own policy, said here so that it is
// one the server states: a client that pings more often than every 5
// minutes, or with no call in flight, is sent GOAWAY (too_many_pings) and
// closed. A ping costs the server a write; a client that keeps a
// connection open must use it.
var keepaliveEnforcement = keepalive.EnforcementPolicy{MinTime: 5 * time.Minute, PermitWithoutStream: false}

// grpcOptions are the gRPC server options that enforce l, and closes a
// connection idle (no call in flight) for idle, when positive.
func (l Limits) grpcOptions(idle time.Duration) []grpc.ServerOption {
	opts := []grpc.ServerOption{
		grpc.KeepaliveEnforcementPolicy(keepaliveEnforcement),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: idle}),
	}
	if l.MaxRecvMsgSize > 0 {
		opts = append(opts, grpc.MaxRecvMsgSize(l.MaxRecvMsgSize))
	}
	if l.MaxConcurrentStreams > 0 {
		opts = append(opts, grpc.MaxConcurrentStreams(l.MaxConcurrentStreams))
	}
	if l.MaxHeaderBytes > 0 {
		opts = append(opts, grpc.MaxHeaderListSize(uint32(l.MaxHeaderBytes)))
	}
	if l.Window > 0 {
		opts = append(opts, grpc.InitialWindowSize(l.Window), grpc.InitialConnWindowSize(l.Window))
	}
	return opts
}

// peerKey is who a connection comes from, for the connection bounds: a
// local user, or a remote address.
type peerKey struct {
	uid   uint32
	local bool       // uid is the kernel's: a Unix socket peer, or a TCP one on this host
	addr  netip.Addr // a remote peer's address; an IPv6 one's /64
}

// remotePeer is the peer of a TCP connection from another host (or whose
// local owner could not be found).
func remotePeer(a netip.Addr) peerKey {
	a = a.Unmap()
	if a.Is6() {
		a = netip.PrefixFrom(a, 64).Masked().Addr()
	}
	return peerKey{addr: a}
}

func (p peerKey) String() string {
	switch {
	case p.local:
		return "uid:" + strconv.FormatUint(uint64(p.uid), 10)
	case p.addr.Is6():
		return netip.PrefixFrom(p.addr, 64).String()
	case p.addr.IsValid():
		return p.addr.String()
	}
	return "unknown"
}

// refusal is why a connection was not admitted.
type refusal int

const (
	admitted     refusal = iota
	overPeer             // its peer holds MaxConnsPerPeer
	overTotal            // the server holds MaxConns, or unprivileged peers their part of it
	overSniffing         // MaxSniffing connections, or the peer's share of them, are being sniffed
	notAdmitted          // Config.Admit refused its peer
)

// connLimiter counts the open connections, by peer and in total, and
// admits a new one only within the [Limits]. Privileged peers (uid 0, the
// server's own uid, or those Config.Admit says are) may use all of
// MaxConns; the others together all but PrivilegedConns of it, each at
// most MaxConnsPerPeer, and ordinary peers together all but
// PermittedConns of that. So the open connections never exceed
// MaxConns, privileged peers always find PrivilegedConns of them free of
// anyone else's, and permitted peers PermittedConns free of ordinary
// peers'.
type connLimiter struct {
	limits Limits

	mu       sync.Mutex
	open     int             // all admitted and not released
	others   int             // those of unprivileged peers
	ordinary int             // those of ordinary peers
	byPeer   map[peerKey]int // unprivileged peers' open connections; no zero entries
}

func newConnLimiter(l Limits) *connLimiter {
	return &connLimiter{limits: l, byPeer: make(map[peerKey]int)}
}

// admit counts a new connection of p, of class c, or says why it may not
// be opened.
func (l *connLimiter) admit(p peerKey, c PeerClass) refusal {
	lim := l.limits
	l.mu.Lock()
	defer l.mu.Unlock()
	if lim.MaxConns > 0 && l.open >= lim.MaxConns {
		return overTotal
	}
	if c != PeerPrivileged {
		if lim.MaxConnsPerPeer > 0 && l.byPeer[p] >= lim.MaxConnsPerPeer {
			return overPeer
		}
		if lim.MaxConns > 0 && l.others >= lim.MaxConns-lim.PrivilegedConns {
			return overTotal
		}
		if c == PeerOrdinary && lim.MaxConns > 0 && l.ordinary >= lim.MaxConns-lim.PrivilegedConns-lim.PermittedConns {
			return overTotal
		}
		if c == PeerOrdinary {
			l.ordinary++
		}
		l.others++
		l.byPeer[p]++
	}
	l.open++
	return admitted
}

// release uncounts a connection admit counted with the same class.
func (l *connLimiter) release(p peerKey, c PeerClass) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.open--
	if c != PeerPrivileged {
		if c == PeerOrdinary {
			l.ordinary--
		}
		l.others--
		if n := l.byPeer[p] - 1; n > 0 {
			l.byPeer[p] = n
		} else {
			delete(l.byPeer, p)
		}
	}
}

// counts returns the open connections, and how many peers hold some
// unprivileged ones.
func (l *connLimiter) counts() (open, peers int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open, len(l.byPeer)
}
