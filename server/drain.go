package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/phasegate/phasegate/health"
)

// Drain stops the server in order:
//
//  1. new application calls are refused with Unavailable ("draining") and
//     the health checker, if any, goes NOT_SERVING;
//  2. [Config.DrainDelay] passes, unless [Server.SkipDrainDelay] was
//     called: in-flight calls finish, checkers see the change;
//  3. the health checker is closed (its Watch streams end), gRPC stops
//     gracefully and HTTP shuts down, both within [Config.StopTimeout];
//     then whatever is left is closed, and so are the listener and any
//     connection still being sniffed.
//
// When ctx ends, or the ctx of any other Drain call, the waits are cut
// short and everything is closed at once: a daemon passes a ctx that a
// second signal cancels. Drain returns nil when the servers stopped
// gracefully, and otherwise an error saying what was cut short. Calling it
// again, or concurrently, waits for the first call and returns its result.
// After Drain, Listen and Serve return [ErrClosed].
func (s *Server) Drain(ctx context.Context) error {
	s.mu.Lock()
	first := s.drainDone == nil
	if first {
		s.drainDone = make(chan struct{})
		s.hurry, s.hurryUp = context.WithCancel(context.Background())
		s.draining.Store(true)
	}
	done, hurryUp := s.drainDone, s.hurryUp
	s.mu.Unlock()

	stop := context.AfterFunc(ctx, hurryUp)
	defer stop()
	if first {
		defer hurryUp()
		err := s.drain(ctx)
		s.mu.Lock()
		s.drainErr = err
		s.mu.Unlock()
		close(done)
		s.doneOnce.Do(func() { close(s.done) })
	}
	<-done
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.drainErr
}

// drain is the first Drain call's work (see Drain for the order). Each step
// that is cut short, by its timeout or a hurried drain, is named in the
// error.
func (s *Server) drain(ctx context.Context) error {
	hc := s.cfg.Health
	if hc != nil {
		hc.Shutdown()
	}
	s.mu.Lock()
	serving, lis, delay := s.serving, s.lis, s.cfg.DrainDelay
	s.mu.Unlock()
	if !serving {
		closeUnserved(hc, lis)
		return nil
	}

	var cut []string
	if s.noDelay.Load() {
		delay = 0
	}
	if !s.waitFor(nil, delay) {
		cut = append(cut, "drain delay")
	}
	if hc != nil {
		hc.Close()
	}
	stopCtx, cancel := s.stopContext()
	defer cancel()
	if s.handover.Load() && !s.handOver(stopCtx, lis) {
		cut = append(cut, "sniffing connections")
	}
	// Nobody will serve a connection that is still being sniffed; cmux
	// would otherwise wait for it until its read deadline.
	_ = lis.Close()
	lis.closeConns(false)
	cut = append(cut, s.stopServers(stopCtx, lis)...)
	return s.drainError(ctx, cut)
}

// SkipDrainDelay makes the next [Server.Drain] skip [Config.DrainDelay]
// and stop the servers at once (gracefully still). The delay is there for
// checkers to see NOT_SERVING before the port stops answering and for
// in-flight calls to end; a server whose gate never opened, because its
// daemon's start failed or was drained before serving, has no traffic
// routed to it and no application call in flight, so the delay would only
// make a failing process slow to exit. Call it before Drain.
func (s *Server) SkipDrainDelay() { s.noDelay.Store(true) }

// closeUnserved ends a server drained before it served: the health checker
// and the listener, if bound, are closed; there is nothing else to stop.
func closeUnserved(hc *health.Checker, lis *trackingListener) {
	if hc != nil {
		hc.Close()
	}
	if lis != nil {
		_ = lis.Close()
	}
}

// stopContext returns the context of the servers' graceful stop: it ends
// when the drain is hurried or, if there is one, after the stop timeout.
func (s *Server) stopContext() (context.Context, context.CancelFunc) {
	if s.cfg.StopTimeout > 0 {
		return context.WithTimeout(s.hurry, s.cfg.StopTimeout)
	}
	return context.WithCancel(s.hurry)
}

// stopServers stops gRPC gracefully and shuts HTTP down, both within
// stopCtx, closes what is left then, and waits for the serving goroutines
// and the gRPC handlers. It returns the steps that were cut short.
func (s *Server) stopServers(stopCtx context.Context, lis *trackingListener) []string {
	var cut []string
	graceful := make(chan struct{})
	go func() {
		s.grpc.GracefulStop()
		close(graceful)
	}()
	httpErr := make(chan error, 1)
	go func() { httpErr <- s.shutdownHTTP(stopCtx) }()

	select {
	case <-graceful:
	case <-stopCtx.Done():
		if !closedWithin(graceful, hurriedGrace) {
			cut = append(cut, "gRPC graceful stop")
			s.grpc.Stop()
		}
	}
	// Shutdown also reports closing the listener, which the drain closed
	// already: only its ctx ending means connections were left.
	if err := <-httpErr; err != nil && !errors.Is(err, net.ErrClosed) {
		cut = append(cut, "HTTP shutdown")
		_ = s.http.Close()
	}
	s.cm.Close()
	lis.closeConns(true)
	s.wg.Wait()
	// After Stop, GracefulStop returns once the handlers did, which is
	// soon since their ctx is cancelled; one that ignores it is waited for
	// no longer than another stop timeout, or not at all when hurried.
	if !s.waitFor(graceful, s.cfg.StopTimeout) {
		cut = append(cut, "gRPC handlers")
	}
	return cut
}

// drainError says which steps of the drain were cut short, and why: the
// stop timeout, or a hurried drain and the cause of the ctx that hurried
// it. Nothing cut short is nil.
func (s *Server) drainError(ctx context.Context, cut []string) error {
	if len(cut) == 0 {
		return nil
	}
	reason := fmt.Sprintf("stop timeout %s", s.cfg.StopTimeout)
	if s.hurry.Err() != nil {
		reason = "drain cut short"
		if c := context.Cause(ctx); c != nil {
			reason += ": " + c.Error()
		}
	}
	return fmt.Errorf("server: %s not finished (%s); connections closed", strings.Join(cut, ", "), reason)
}

// shutdownHTTP is http.Server.Shutdown, which waits for every connection
// that read a byte of a request, closing meanwhile those whose request
// never came whole (see stalledRequest).
func (s *Server) shutdownHTTP(ctx context.Context) error {
	done := make(chan error, 1)
	go func() { done <- s.http.Shutdown(ctx) }()
	t := time.NewTicker(stalledRequest / 5)
	defer t.Stop()
	for {
		select {
		case err := <-done:
			return err
		case <-t.C:
			s.httpConns.closeStalled(stalledRequest)
		}
	}
}

// waitFor waits until c is closed or, when d is positive, d passed, unless
// the drain is hurried. With a nil c it waits for d alone, which is no wait
// at all for a zero d. It reports whether the wait ended without being
// hurried or timing out on c.
func (s *Server) waitFor(c <-chan struct{}, d time.Duration) bool {
	select {
	case <-c:
		return true
	default:
	}
	if c == nil && d <= 0 {
		return true
	}
	var timeout <-chan time.Time
	if d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-c:
		return true
	case <-timeout:
		return c == nil
	case <-s.hurry.Done():
	}
	// What c waits for may be ending at this moment: after grpc's Stop,
	// GracefulStop returns as soon as its handlers, whose contexts are
	// cancelled, did. A hurried drain gives it a moment, so that a stop
	// with nothing left to wait for is not reported as cut short.
	return c != nil && closedWithin(c, hurriedGrace)
}

// hurriedGrace is how long a hurried drain still waits for what it was
// waiting for to end by itself.
const hurriedGrace = 50 * time.Millisecond

// closedWithin reports whether c is closed within d.
func closedWithin(c <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-c:
		return true
	case <-t.C:
		return false
	}
}
