package server

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2/hpack"
)

// trackingListener remembers the connections it accepted until they are
// closed, so that a drain can close those that cmux is still sniffing: cmux
// does not track them, and its Serve waits for them before it returns. Its
// gate admits each connection within the server's [Limits] and backs off
// when the process is out of descriptors (cmux would spin on the error).
type trackingListener struct {
	net.Listener
	gate  *connGate
	sniff sniffBounds

	// stopped: Accept takes no more connections, so that those still
	// queued in the backlog are left to whoever holds the socket next (an
	// in-place upgrade's new image). It blocks until Close instead of
	// failing: cmux, once its Accept fails, closes every connection it is
	// still sniffing or has not handed over yet.
	stopped  atomic.Bool
	parked   atomic.Bool   // a stopped Accept waits for Close: no connection is on its way in
	released chan struct{} // closed by Close: a stopped Accept returns
	stopping chan struct{} // closed by stopAccepting: a backing-off Accept parks
	stopOnce sync.Once

	mu     sync.Mutex
	conns  map[*trackedConn]struct{}
	closed bool
}

// sniffBounds bound a connection until it is handed over: the bytes read
// (MaxSniffBytes; zero, none) and the time, writes included
// (SniffTimeout; zero, none).
type sniffBounds struct {
	bytes   int
	timeout time.Duration
}

func newTrackingListener(l net.Listener, gate *connGate, sniff sniffBounds) *trackingListener {
	return &trackingListener{Listener: l, gate: gate, sniff: sniff, conns: make(map[*trackedConn]struct{}),
		released: make(chan struct{}), stopping: make(chan struct{})}
}

func (l *trackingListener) Accept() (net.Conn, error) {
	retry := acceptRetryMin
	for {
		if l.stopped.Load() {
			return nil, l.park()
		}
		c, err := l.Listener.Accept()
		switch {
		case err != nil && l.stopped.Load(): // woken by stopAccepting's deadline
			return nil, l.park()
		case err != nil && resourceExhausted(err):
			l.gate.acceptFailed(err, retry)
			if !l.backOff(retry) {
				return nil, net.ErrClosed
			}
			retry = min(2*retry, acceptRetryMax)
			continue
		case err != nil:
			return nil, err
		}
		retry = acceptRetryMin
		l.gate.accepted()
		tc, err := l.track(c)
		if err != nil {
			return nil, err
		}
		if tc != nil {
			return tc, nil
		}
	}
}

// track wraps c, once the gate admitted it, and remembers it; nil when the
// gate refused it (closed already). The sniff deadline starts now: it
// covers the whole decision, a TLS handshake and the server's preface
// included.
func (l *trackingListener) track(c net.Conn) (*trackedConn, error) {
	tc := &trackedConn{Conn: c, l: l, accepted: time.Now(), sniffLeft: l.sniff.bytes}
	if l.sniff.bytes == 0 {
		tc.sniffLeft = -1
	}
	if l.sniff.timeout > 0 {
		_ = c.SetDeadline(tc.accepted.Add(l.sniff.timeout))
	}
	if uc, ok := c.(*net.UnixConn); ok {
		// The kernel keeps what the peer was at connect time. Without it
		// (an error here), peer stays nil and every call on the
		// connection is refused as unauthenticated: an error from Accept
		// would end the multiplexer.
		if pc, err := readPeerCred(uc); err == nil {
			tc.peer = &pc
		}
		tc.Conn = newRightsConn(uc) // a descriptor its peer passes (passfd.go)
	}
	tc.who = l.gate.peerOf(c, tc.peer)
	tc.class = l.gate.class(tc.who, tc.peer)
	if !l.gate.admit(c, tc.who, tc.class) {
		return nil, nil
	}
	tc.sniffing.Store(tc.class != PeerPrivileged) // those the gate counted
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		_ = tc.Close()
		return nil, net.ErrClosed
	}
	l.conns[tc] = struct{}{}
	l.mu.Unlock()
	return tc, nil
}

// backOff waits d before the next accept, unless the listener is closed
// (false) or stops accepting meanwhile.
func (l *trackingListener) backOff(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-l.stopping:
	case <-l.released:
		return false
	}
	return true
}

// stopAccepting makes Accept stop taking connections without taking one
// more: a connection accepted meanwhile is returned and served; those
// still in the backlog stay there. It wakes an Accept blocked in the
// poller with a deadline, which, unlike Close, never races with an accept4
// that already took a connection off the queue.
func (l *trackingListener) stopAccepting() {
	l.stopped.Store(true)
	l.stopOnce.Do(func() { close(l.stopping) })
	if dl, ok := l.Listener.(interface{ SetDeadline(time.Time) error }); ok {
		_ = dl.SetDeadline(time.Now())
	}
}

func (l *trackingListener) Close() error {
	l.mu.Lock()
	if !l.closed {
		close(l.released)
	}
	l.closed = true
	l.mu.Unlock()
	l.gate.owners.close()
	return l.Listener.Close()
}

// park waits, after stopAccepting, until Close. A connection the caller
// (cmux) took before is tracked by then: cmux only calls Accept again once
// it has handed the previous one to its sniffing goroutine.
func (l *trackingListener) park() error {
	l.parked.Store(true)
	<-l.released
	return net.ErrClosed
}

// openSince counts the connections taken at or after t and not closed yet.
func (l *trackingListener) openSince(t time.Time) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for c := range l.conns {
		if !c.accepted.Before(t) {
			n++
		}
	}
	return n
}

// sniffing counts the connections taken but not yet handed to the gRPC or
// HTTP server.
func (l *trackingListener) sniffing() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for c := range l.conns {
		if !c.handedOver.Load() {
			n++
		}
	}
	return n
}

// closeConns closes the tracked connections: all of them, or only those
// not yet handed to the gRPC or HTTP server.
func (l *trackingListener) closeConns(all bool) {
	l.mu.Lock()
	var cs []*trackedConn
	for c := range l.conns {
		if all || !c.handedOver.Load() {
			cs = append(cs, c)
		}
	}
	l.mu.Unlock()
	for _, c := range cs {
		_ = c.Close()
	}
}

type trackedConn struct {
	net.Conn
	l          *trackingListener
	accepted   time.Time
	peer       *PeerCred // who connected, on a Unix socket
	who        peerKey   // whose share of the bounds it takes
	class      PeerClass // which share: never PeerRefused
	handedOver atomic.Bool
	sniffing   atomic.Bool // holds a share of MaxSniffing (unprivileged), until handed over or closed
	closeOnce  sync.Once

	// Until the handover, read only by the multiplexer's goroutine.
	sniffLeft int      // bytes it may still read; -1: no bound
	protocol  protocol // what it speaks, once decided
}

// errSniffBytes ends a connection that sent more than MaxSniffBytes before
// its protocol was known.
var errSniffBytes = errors.New("server: more than MaxSniffBytes sent before the protocol was known")

// Read reads at most what is left of MaxSniffBytes until the connection is
// handed over; then it is the connection's own.
func (c *trackedConn) Read(p []byte) (int, error) {
	if c.handedOver.Load() || c.sniffLeft < 0 {
		return c.Conn.Read(p)
	}
	if c.sniffLeft == 0 {
		return 0, errSniffBytes
	}
	if len(p) > c.sniffLeft {
		p = p[:c.sniffLeft]
	}
	n, err := c.Conn.Read(p)
	c.sniffLeft -= n
	return n, err
}

// handOver marks the connection as the server's: its sniff deadline and
// bound are lifted, its share of MaxSniffing given back.
func (c *trackedConn) handOver() {
	c.handedOver.Store(true)
	_ = c.Conn.SetDeadline(time.Time{})
	c.endSniffing()
}

// endSniffing gives back the connection's share of MaxSniffing, once.
func (c *trackedConn) endSniffing() {
	if c.sniffing.CompareAndSwap(true, false) {
		c.l.gate.sniffed(c.who, c.class)
	}
}

func (c *trackedConn) Close() error {
	c.closeOnce.Do(func() {
		c.l.mu.Lock()
		delete(c.l.conns, c)
		c.l.mu.Unlock()
		c.endSniffing()
		c.l.gate.limiter.release(c.who, c.class)
	})
	return c.Conn.Close()
}

// handoffListener is a cmux listener that marks the connections it hands to
// a server, which then owns them.
type handoffListener struct {
	net.Listener
}

func (l handoffListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if tc, ok := rawConnOf(c).(*trackedConn); ok {
		tc.handOver()
	}
	return c, nil
}

// matcher is the multiplexer's matcher of the connections that speak p:
// the first one asked reads the connection ([decide]) and the others read
// its answer, so a connection is read once, by the server's own reader.
func (g *connGate) matcher(p protocol) func(io.Writer, io.Reader) bool {
	return func(w io.Writer, r io.Reader) bool {
		c, ok := w.(net.Conn)
		if !ok {
			return false
		}
		tc, ok := rawConnOf(c).(*trackedConn)
		if !ok {
			return false
		}
		if tc.protocol == undecided {
			var err error
			if tc.protocol, err = decide(w, r); tc.protocol == refused && refusedForWhatItSent(err) {
				g.refuseProtocol(tc.who, err)
			}
		}
		return tc.protocol == p
	}
}

// refusedForWhatItSent reports whether the port refused a connection for
// what it sent: more than MaxSniffBytes, a frame it does not take before a
// first request, or a header block that does not decode. A connection
// that sent nothing before SniffTimeout, or closed first (a TCP check), is
// closed without a word.
func refusedForWhatItSent(err error) bool {
	var fe *frameRefusedError
	var de hpack.DecodingError
	var ie hpack.InvalidIndexError
	return errors.Is(err, errSniffBytes) || errors.As(err, &fe) || errors.As(err, &de) || errors.As(err, &ie)
}
