package server

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

// boundedServer serves "/ok" with lim, on loopback, drained at the end.
func boundedServer(t *testing.T, lim Limits, sniff time.Duration) *Server {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the peers are sockets made as other users")
	}
	cfg := DefaultConfig()
	cfg.Addr, cfg.Limits, cfg.SniffTimeout, cfg.DrainDelay, cfg.StopTimeout = "127.0.0.1:0", lim, sniff, 0, time.Second
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Handle("GET /ok", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })); err != nil {
		t.Fatal(err)
	}
	if err := s.Serve(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Drain(context.Background()) })
	return s
}

// held is a connection a test holds open: asked once over HTTP/1.1 and kept
// alive, or refused by the server at accept.
type held struct {
	net.Conn
	err error // nil: answered 200 and kept
}

// open connects as uid (from src, when given) and asks for /ok on the
// connection, keeping it.
func open(t *testing.T, s *Server, uid int, src string) held {
	t.Helper()
	return ask(t, dialFrom(t, uid, src, s.Addr().String()))
}

// ask asks for /ok on c, keeping it, closed at the test's end.
func ask(t *testing.T, c net.Conn) held {
	t.Helper()
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, "GET /ok HTTP/1.1\r\nHost: t\r\n\r\n"); err != nil {
		return held{c, err}
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return held{c, err}
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return held{c, errors.New(resp.Status)}
	}
	return held{c, nil}
}

// refused reports whether the server closed the connection at accept
// (a reset; an end of file if the reset came first; on a Unix socket, a
// broken pipe if the close came before the request).
func (h held) refused() bool {
	return h.err != nil && (errors.Is(h.err, io.EOF) || errors.Is(h.err, io.ErrUnexpectedEOF) || errors.Is(h.err, syscall.EPIPE) ||
		strings.Contains(h.err.Error(), "reset"))
}

// waitOpen waits until the server counts n open connections.
func waitOpen(t *testing.T, s *Server, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for s.ConnStats().Open != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections open, want %d", s.ConnStats().Open, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// The bounds hold at accept, per peer by uid (a peer's other loopback
// addresses are still it), in total, with the privileged part kept for
// root; a connection closed gives its share back, and a drain gives
// every share back.
func TestConnBoundsAtAccept(t *testing.T) {
	s := boundedServer(t, Limits{MaxConns: 6, PrivilegedConns: 2, MaxConnsPerPeer: 2}, 30*time.Second)
	const nobody, nogroup, other = 65534, 65533, 65532
	type step struct {
		uid     int
		src     string
		refused bool
	}
	var kept []held
	for i, st := range []step{
		{nobody, "", false}, {nobody, "", false}, {nobody, "", true},
		{nobody, "127.0.0.2", true}, // another address is no other peer
		{nogroup, "", false}, {nogroup, "127.0.0.3", false},
		{other, "", true},                             // the unprivileged part, 4 of 6, is taken
		{0, "", false}, {0, "", false}, {0, "", true}, // root's part, then the total
	} {
		h := open(t, s, st.uid, st.src)
		if st.refused != h.refused() || !st.refused && h.err != nil {
			t.Fatalf("step %d: uid %d from %q: %v, want refused %v", i, st.uid, st.src, h.err, st.refused)
		}
		if !st.refused {
			kept = append(kept, h)
		}
	}
	st := s.ConnStats()
	if st.Open != 6 || st.RefusedPerPeer != 2 || st.RefusedTotal != 2 || st.Impaired.IsZero() || st.ImpairedNow {
		t.Errorf("ConnStats = %+v, want 6 open, 2 refused per peer and 2 in total, impaired (not now)", st)
	}
	// One of nobody's closes: nobody may open one again, and only one.
	kept[0].Close()
	waitOpen(t, s, 5)
	if h := open(t, s, nobody, ""); h.err != nil {
		t.Fatalf("nobody after closing one: %v", h.err)
	}
	if h := open(t, s, nobody, ""); !h.refused() {
		t.Fatalf("nobody over its bound again: %v, want refused", h.err)
	}
	if err := s.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	if open := s.ConnStats().Open; open != 0 {
		t.Errorf("after the drain %d connections are still counted", open)
	}
}

// After a flood ends the port takes connections as before: silent
// connections the sniff timeout closed, and those the flood closed
// itself, give their shares back.
func TestPortTakesConnectionsAfterFlood(t *testing.T) {
	const nobody = 65534
	s := boundedServer(t, Limits{MaxConns: 32, PrivilegedConns: 4, MaxConnsPerPeer: 8}, time.Second)
	var flood []net.Conn
	for range 50 {
		flood = append(flood, dialFrom(t, nobody, "", s.Addr().String()))
	}
	deadline := time.Now().Add(10 * time.Second)
	for st := s.ConnStats(); st.Open+int(st.RefusedPerPeer) < 50; st = s.ConnStats() {
		if time.Now().After(deadline) {
			t.Fatalf("50 connections: %+v", st)
		}
		time.Sleep(time.Millisecond)
	}
	if st := s.ConnStats(); st.Open != 8 || st.RefusedPerPeer != 42 {
		t.Errorf("50 connections of one peer with a bound of 8: %+v, want 8 open and 42 refused", st)
	}
	if h := open(t, s, 0, ""); h.err != nil {
		t.Fatalf("root during the flood: %v", h.err)
	}
	waitOpen(t, s, 1) // the sniff timeout closed the silent ones; root's is kept alive
	for _, c := range flood {
		c.Close()
	}
	for i := range 8 {
		if h := open(t, s, nobody, ""); h.err != nil {
			t.Fatalf("nobody's connection %d after the flood: %v", i, h.err)
		}
	}
}
