package server

import (
	"net"
	"sync"
	"sync/atomic"
)

// trackingListener remembers the connections it accepted until they are
// closed, so that a drain can close those that cmux is still sniffing: cmux
// does not track them, and its Serve waits for them before it returns.
type trackingListener struct {
	net.Listener

	mu     sync.Mutex
	conns  map[*trackedConn]struct{}
	closed bool
}

func newTrackingListener(l net.Listener) *trackingListener {
	return &trackingListener{Listener: l, conns: make(map[*trackedConn]struct{})}
}

func (l *trackingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	tc := &trackedConn{Conn: c, l: l}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		_ = c.Close()
		return nil, net.ErrClosed
	}
	l.conns[tc] = struct{}{}
	l.mu.Unlock()
	return tc, nil
}

func (l *trackingListener) Close() error {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	return l.Listener.Close()
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
	handedOver atomic.Bool
	closeOnce  sync.Once
}

func (c *trackedConn) Close() error {
	c.closeOnce.Do(func() {
		c.l.mu.Lock()
		delete(c.l.conns, c)
		c.l.mu.Unlock()
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
		tc.handedOver.Store(true)
	}
	return c, nil
}
