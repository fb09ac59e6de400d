package server

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync/atomic"
)

// retryAfter is the Retry-After, in seconds, of a gated route's 503: the
// daemon's state can change at any moment, and a refused request costs it
// next to nothing.
const retryAfter = "1"

// route is a declared HTTP route and its late-bound handler.
type route struct {
	s       *Server
	pattern string
	h       atomic.Pointer[handlerBox]
}

type handlerBox struct{ h http.Handler }

// errHandlerNotBound is the reason given while a declared route has no
// handler.
var errHandlerNotBound = errors.New("handler not bound yet")

// errDraining is the reason given to gated calls and requests from the
// moment the server drains.
var errDraining = errors.New("draining")

// DeclareHTTP registers a gated HTTP route for pattern (http.ServeMux
// syntax, such as "POST /v1/slots"), whose handler is bound later with
// [Server.BindHTTP]. Until it is bound and the gate is open, and from the
// moment the server drains, a request gets 503 Service Unavailable with a
// Retry-After header and a body saying why, in the words gRPC callers get
// with codes.Unavailable: "POST /v1/slots unavailable: starting: phase
// reclaim 1200/5000 namespaces", "… unavailable: draining". While draining
// the answer also closes the connection, so that the client's next
// attempt goes elsewhere.
//
// Once admitted, the request reaches the handler with r.TLS set on a TLS
// port (net/http leaves it nil behind the multiplexer).
//
// Declare a route early, before [Server.Serve], so that clients get that
// answer instead of a 404 while the daemon starts; it may be declared at
// any time though, unlike a gRPC service. Routes added with [Server.Handle]
// (health, metrics, debug) are not gated. DeclareHTTP fails on an invalid
// pattern, one already declared, one that conflicts with a registered
// pattern, and with a [*ReservedPathError] one on a path the framework
// serves itself (see [Server.Reserve]).
func (s *Server) DeclareHTTP(pattern string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, dup := s.routes[pattern]; dup {
		return fmt.Errorf("server: DeclareHTTP %q: already declared", pattern)
	}
	if err := s.checkReservedLocked(pattern); err != nil {
		return fmt.Errorf("server: DeclareHTTP %q: %w", pattern, err)
	}
	rt := &route{s: s, pattern: pattern}
	if err := s.handle(pattern, rt); err != nil {
		return fmt.Errorf("server: DeclareHTTP %q: %w", pattern, err)
	}
	s.routes[pattern] = rt
	return nil
}

// BindHTTP sets the handler of a declared route, which then serves
// requests whenever the gate is open. It can be called at any time, and
// again to replace the handler. It fails when pattern was not declared
// with [Server.DeclareHTTP] or h is nil.
func (s *Server) BindHTTP(pattern string, h http.Handler) error {
	s.mu.Lock()
	rt, ok := s.routes[pattern]
	s.mu.Unlock()
	if !ok {
		return fmt.Errorf("server: BindHTTP %q: route not declared", pattern)
	}
	if h == nil {
		return fmt.Errorf("server: BindHTTP %q: nil handler", pattern)
	}
	rt.h.Store(&handlerBox{h: h})
	return nil
}

func (rt *route) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s := rt.s
	r = withTLSState(r)
	if s.cfg.RequireClientCert && (r.TLS == nil || len(r.TLS.VerifiedChains) == 0) {
		refuse(w, http.StatusForbidden, fmt.Sprintf("%s requires a client certificate signed by the configured CA", rt.pattern))
		return
	}
	var why error
	switch {
	case s.draining.Load():
		why = errDraining
	case s.gate != nil:
		why = s.gate.Allow()
	}
	b := rt.h.Load()
	if why == nil && b == nil {
		why = errHandlerNotBound
	}
	if why != nil {
		h := w.Header()
		h.Set("Retry-After", retryAfter)
		if why == errDraining {
			h.Set("Connection", "close")
		}
		refuse(w, http.StatusServiceUnavailable, fmt.Sprintf("%s unavailable: %v", rt.pattern, why))
		return
	}
	b.h.ServeHTTP(w, r)
}

// refuse answers a request that may not reach its handler.
func refuse(w http.ResponseWriter, code int, msg string) {
	h := w.Header()
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(code)
	_, _ = fmt.Fprintln(w, msg)
}

// connKey is the context key of the connection a request came on.
type connKey struct{}

// withTLSState returns r with its TLS field set. net/http sets it only for
// a *tls.Conn, and the multiplexer wraps the connection, so for a TLS port
// it is nil until filled here from the connection itself: the declared
// route reads the client certificate from it, and so can its handler.
func withTLSState(r *http.Request) *http.Request {
	if r.TLS != nil {
		return r
	}
	c, _ := r.Context().Value(connKey{}).(net.Conn)
	tc := tlsConnOf(c)
	if tc == nil {
		return r
	}
	state := tc.ConnectionState()
	r2 := new(http.Request)
	*r2 = *r
	r2.TLS = &state
	return r2
}
