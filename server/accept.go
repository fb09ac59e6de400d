package server

import (
	"errors"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// ConnStats is what a [Server]'s accept loop went through since it
// started listening, for metrics and for whoever must know whether
// clients could reach it ([Server.ConnStats]).
type ConnStats struct {
	// Open counts the connections accepted and not closed yet.
	Open int
	// RefusedPerPeer and RefusedTotal count the connections closed at
	// accept because their peer held MaxConnsPerPeer, or because the
	// server held MaxConns (or unprivileged peers their part of it).
	RefusedPerPeer, RefusedTotal uint64
	// Sniffing counts the connections of unprivileged peers accepted and
	// not yet handed to the gRPC or the HTTP server: what MaxSniffing
	// bounds.
	Sniffing int
	// RefusedAdmission counts the connections closed at accept because
	// [Config.Admit] refused their peer.
	RefusedAdmission uint64
	// RefusedSniffing counts the connections closed at accept because
	// MaxSniffing connections, or their peer's MaxSniffingPerPeer, were
	// being sniffed; RefusedProtocol those closed before the handover for
	// what they sent: more than MaxSniffBytes, or an HTTP/2 frame no
	// client sends before its first request.
	RefusedSniffing, RefusedProtocol uint64
	// AcceptErrors counts accepts that failed for want of resources:
	// descriptors (EMFILE, ENFILE) or kernel memory (ENOBUFS, ENOMEM).
	// The accept loop backs off (5 ms, doubling to 1 s) and goes on.
	AcceptErrors uint64
	// Impaired is the last time the server could not take a connection
	// that its own bounds did not refuse on the peer's account: an accept
	// that failed for want of resources, or a connection refused over
	// MaxConns. A client may have failed to reach it then. Zero: never.
	Impaired time.Time
	// ImpairedNow says the last accept failed for want of resources and
	// none has succeeded since: clients cannot reach the server now.
	ImpairedNow bool
}

// connGate is what the server decides at accept: who a connection comes
// from, whether it is admitted and the [Limits] let it open and be
// sniffed, and what the accept loop and the sniffing went through, logged
// at most once a second.
type connGate struct {
	limiter *connLimiter // open connections
	sniff   *connLimiter // those not handed over yet
	owners  *ownerFinder
	self    uint32                         // the server's own uid
	classOf func(cred *PeerCred) PeerClass // Config.Admit; nil: every peer ordinary
	log     *slog.Logger

	refusedPeer, refusedTotal, acceptErrors   atomic.Uint64
	refusedSniffing, refusedProtocol          atomic.Uint64
	refusedAdmission                          atomic.Uint64
	impaired                                  atomic.Int64 // Unix ns of the last impairment; 0: none
	impairedNow                               atomic.Bool
	refusedLog, acceptLog, ownerLog, admitLog throttle
	protocolLog                               throttle
}

func newConnGate(l Limits, admit func(*PeerCred) PeerClass, log *slog.Logger) *connGate {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &connGate{limiter: newConnLimiter(l), sniff: newConnLimiter(sniffLimits(l)), owners: newOwnerFinder(),
		self: uint32(os.Geteuid()), classOf: admit, log: log}
}

// sniffLimits are the bounds of unprivileged peers' connections being
// sniffed, as a connLimiter's (privileged peers' are not counted): for
// permitted peers, the part of MaxSniffing that PermittedConns is of
// MaxConns.
func sniffLimits(l Limits) Limits {
	s := Limits{MaxConns: l.MaxSniffing, MaxConnsPerPeer: l.MaxSniffingPerPeer}
	if l.MaxConns > 0 {
		s.PermittedConns = min(l.MaxSniffing*l.PermittedConns/l.MaxConns, s.MaxConns)
	}
	return s
}

// stats returns what the gate counted.
func (g *connGate) stats() ConnStats {
	open, _ := g.limiter.counts()
	sniffing, _ := g.sniff.counts()
	st := ConnStats{
		Open:             open,
		Sniffing:         sniffing,
		RefusedPerPeer:   g.refusedPeer.Load(),
		RefusedTotal:     g.refusedTotal.Load(),
		RefusedSniffing:  g.refusedSniffing.Load(),
		RefusedAdmission: g.refusedAdmission.Load(),
		RefusedProtocol:  g.refusedProtocol.Load(),
		AcceptErrors:     g.acceptErrors.Load(),
		ImpairedNow:      g.impairedNow.Load(),
	}
	if ns := g.impaired.Load(); ns != 0 {
		st.Impaired = time.Unix(0, ns)
	}
	return st
}

// peerOf says who c comes from: for a Unix socket the credentials read at
// accept (unknown, nil, counts as one unprivileged peer), for TCP the
// local owner of the other end, or else its address.
func (g *connGate) peerOf(c net.Conn, cred *PeerCred) peerKey {
	if cred != nil {
		return peerKey{uid: cred.UID, local: true}
	}
	ra, ok1 := c.RemoteAddr().(*net.TCPAddr)
	la, ok2 := c.LocalAddr().(*net.TCPAddr)
	if !ok1 || !ok2 {
		return peerKey{}
	}
	remote, ours := ra.AddrPort(), la.AddrPort()
	uid, err := g.owners.owner(remote, ours)
	switch {
	case err == nil:
		return peerKey{uid: uid, local: true}
	case !errors.Is(err, errNoOwner) || remote.Addr().Unmap().IsLoopback():
		// A loopback peer always has a socket here, unless it closed
		// already: no answer for one means the kernel cannot tell
		// (no inet_diag), and local users share their address's bound.
		if n, ok := g.ownerLog.allow(time.Now()); ok {
			g.log.Warn("connection's local user not found: counted by its address", "peer", remote.String(), "error", err, "since_last", n)
		}
	}
	return remotePeer(remote.Addr())
}

// class says which share of the bounds a connection of peer p, whose
// Unix credentials are cred (nil: none), may use: uid 0 and the server's
// own user are privileged, the others what Config.Admit says.
func (g *connGate) class(p peerKey, cred *PeerCred) PeerClass {
	switch {
	case p.local && (p.uid == 0 || p.uid == g.self):
		return PeerPrivileged
	case g.classOf == nil:
		return PeerOrdinary
	}
	return g.classOf(cred)
}

// admit counts c's peer p, of class k, in, among the open connections
// and those being sniffed, or refuses it: counted, logged at most once a
// second, and closed at once.
func (g *connGate) admit(c net.Conn, p peerKey, k PeerClass) bool {
	why := notAdmitted
	if k != PeerRefused {
		why = g.limiter.admit(p, k)
	}
	if why == admitted {
		if k == PeerPrivileged {
			return true // not counted among those being sniffed
		}
		if why = g.sniff.admit(p, k); why == admitted {
			return true
		}
		g.limiter.release(p, k)
		why = overSniffing
	}
	if why == notAdmitted {
		// On the peer's account: the server is not impaired.
		g.refuse(c)
		g.refusedAdmission.Add(1)
		if n, ok := g.admitLog.allow(time.Now()); ok {
			g.log.Warn("connection refused: its peer is not admitted here", "peer", p.String(), "refused_since_last", n)
		}
		return false
	}
	var lim int
	var what string
	switch why {
	case overPeer:
		g.refusedPeer.Add(1)
		lim, what = g.limiter.limits.MaxConnsPerPeer, "per peer"
	case overSniffing:
		// A flood of the port's first bytes by unprivileged peers; the
		// server is not impaired: privileged peers are not counted, and
		// connections are handed over within a round trip.
		g.refusedSniffing.Add(1)
		lim, what = g.sniff.limits.MaxConns, "being sniffed"
	default:
		g.refusedTotal.Add(1)
		g.impaired.Store(time.Now().UnixNano())
		lim, what = g.limiter.limits.MaxConns, "in total"
	}
	g.refuse(c)
	if n, ok := g.refusedLog.allow(time.Now()); ok {
		open, peers := g.limiter.counts()
		g.log.Warn("connection refused: over the server's bound", "peer", p.String(), "bound", what, "limit", lim,
			"open", open, "peers", peers, "refused_since_last", n)
	}
	return false
}

// refuse closes a connection refused at accept (a TCP one with a reset,
// so that neither end keeps it in TIME_WAIT).
func (g *connGate) refuse(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

// sniffed gives back the sniffing share of p's connection, of class k: it
// was handed over, or closed before.
func (g *connGate) sniffed(p peerKey, k PeerClass) { g.sniff.release(p, k) }

// refuseProtocol counts a connection closed before the handover for what
// it sent, and logs it at most once a second.
func (g *connGate) refuseProtocol(p peerKey, err error) {
	g.refusedProtocol.Add(1)
	if n, ok := g.protocolLog.allow(time.Now()); ok {
		g.log.Warn("connection refused before its protocol was known", "peer", p.String(), "error", err, "refused_since_last", n)
	}
}

// acceptFailed records an accept that failed for want of resources, and
// logs it at most once a second.
func (g *connGate) acceptFailed(err error, retry time.Duration) {
	g.acceptErrors.Add(1)
	g.impaired.Store(time.Now().UnixNano())
	g.impairedNow.Store(true)
	if n, ok := g.acceptLog.allow(time.Now()); ok {
		g.log.Error("accept failed: no connection can be taken until resources are freed", "error", err,
			"retry_in", retry.String(), "failed_since_last", n)
	}
}

// accepted records an accept that succeeded: the server can be reached.
func (g *connGate) accepted() {
	if g.impairedNow.Load() {
		g.impaired.Store(time.Now().UnixNano())
		g.impairedNow.Store(false)
	}
}

// resourceExhausted reports whether an accept failed for want of
// descriptors or kernel memory: a condition that passes, unlike a closed
// listener, and that the accept loop must not spin on.
func resourceExhausted(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) ||
		errors.Is(err, syscall.ENOBUFS) || errors.Is(err, syscall.ENOMEM)
}

// Backoff of an accept that failed for want of resources, as net/http's.
const (
	acceptRetryMin = 5 * time.Millisecond
	acceptRetryMax = time.Second
)

// throttle lets a kind of log line through at most once a second.
type throttle struct {
	mu      sync.Mutex
	next    time.Time
	skipped int
}

// allow reports whether a line may be written at now, and how many were
// held back since the last one.
func (t *throttle) allow(now time.Time) (skipped int, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if now.Before(t.next) {
		t.skipped++
		return 0, false
	}
	skipped, t.skipped, t.next = t.skipped, 0, now.Add(time.Second)
	return skipped, true
}
