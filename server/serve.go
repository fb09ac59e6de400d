package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/soheilhy/cmux"
)

// ErrClosed is returned by [Server.Listen] and [Server.Serve] after
// [Server.Drain].
var ErrClosed = errors.New("server: drained")

// ErrNoAddr is returned by [Server.Listen] and [Server.Serve] when there
// is nothing to listen on: no [Config.Listener], and neither
// [Config.Addr] nor [Server.SetPort] gave an address.
var ErrNoAddr = errors.New("server: no address to listen on: Config.Addr is empty, and neither Config.Listener nor SetPort gave one")

// Listen binds the port, or takes [Config.Listener], and returns its
// address. Connections queue in the kernel until [Server.Serve]. Calling
// it again returns the same address.
func (s *Server) Listen(ctx context.Context) (net.Addr, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.drainDone != nil {
		return nil, ErrClosed
	}
	if s.lis != nil {
		return s.lis.Addr(), nil
	}
	l := s.cfg.Listener
	if l == nil && s.cfg.Addr == "" {
		return nil, ErrNoAddr
	}
	if l == nil {
		var lc net.ListenConfig
		var err error
		if l, err = lc.Listen(ctx, "tcp", s.cfg.Addr); err != nil {
			return nil, fmt.Errorf("server: listen: %w", err)
		}
	}
	s.lis = newTrackingListener(l, s.conns, sniffBounds{bytes: s.cfg.MaxSniffBytes, timeout: s.cfg.SniffTimeout})
	return l.Addr(), nil
}

// Addr returns the bound address, or nil before [Server.Listen].
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lis == nil {
		return nil
	}
	return s.lis.Addr()
}

// SetPort sets the address [Server.Listen] binds and the delay
// [Server.Drain] waits, in place of [Config.Addr] and [Config.DrainDelay],
// for a server whose owner learns them only once it started (a phase read
// its configuration). A [Config.Listener] is still served instead of any
// address. Call it before Listen; it returns [ErrServing] after.
func (s *Server) SetPort(addr string, drainDelay time.Duration) error {
	if drainDelay < 0 {
		return fmt.Errorf("server: drain delay %v, must not be negative", drainDelay)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lis != nil || s.drainDone != nil {
		return ErrServing
	}
	s.cfg.Addr, s.cfg.DrainDelay = addr, drainDelay
	return nil
}

// Serve starts serving gRPC and HTTP on the port, binding it first if
// [Server.Listen] was not called (ctx bounds only that). It returns at once;
// the goroutines it starts are stopped by [Server.Drain]. From now on
// health answers, and calls to declared services fail with Unavailable
// until they are bound and the gate opens. Calling Serve again does
// nothing.
func (s *Server) Serve(ctx context.Context) error {
	if _, err := s.Listen(ctx); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.drainDone != nil {
		return ErrClosed
	}
	if s.serving {
		return nil
	}
	s.serving = true

	var base net.Listener = s.lis
	if s.cfg.TLS != nil {
		// The handshake happens on the first read of the sniffing, so its
		// deadline and MaxSniffBytes bound a client that never completes
		// it, or sends a certificate chain of megabytes.
		base = tls.NewListener(s.lis, s.cfg.TLS)
	}
	// The sniff deadline is the connection's own, set at accept (see
	// trackingListener.track), so cmux's read timeout stays off.
	m := cmux.New(base)
	grpcL := handoffListener{m.MatchWithWriters(s.conns.matcher(speaksGRPC))}
	httpL := handoffListener{m.MatchWithWriters(s.conns.matcher(speaksHTTP))}
	s.cm = m

	s.wg.Add(3)
	go func() {
		defer s.wg.Done()
		s.served("connection multiplexer", m.Serve())
	}()
	go func() {
		defer s.wg.Done()
		s.served("gRPC", s.grpc.Serve(grpcL))
	}()
	go func() {
		defer s.wg.Done()
		s.served("HTTP", s.http.Serve(httpL))
	}()
	return nil
}

// served records how a serving goroutine ended. Any end before Drain is a
// failure; during Drain, closed listeners are the expected way out.
func (s *Server) served(what string, err error) {
	if s.draining.Load() || err == nil || errors.Is(err, http.ErrServerClosed) {
		return
	}
	s.mu.Lock()
	if s.serveErr == nil {
		s.serveErr = fmt.Errorf("server: %s stopped serving: %w", what, err)
	}
	s.mu.Unlock()
	s.doneOnce.Do(func() { close(s.done) })
}

// Done is closed when the server stopped serving: at the end of Drain, or
// when serving failed before it, in which case [Server.Err] says why. A
// daemon can watch it to fail its lifecycle.
func (s *Server) Done() <-chan struct{} { return s.done }

// Err returns why serving failed before Drain, or nil.
func (s *Server) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.serveErr
}
