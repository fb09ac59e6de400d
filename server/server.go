package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/soheilhy/cmux"
	"google.golang.org/grpc"
	"google.golang.org/grpc/reflection"

	"github.com/phasegate/phasegate/health"
)

// ErrServing is returned by [Server.Declare] once the server serves or
// drains: grpc-go cannot register services after Serve.
var ErrServing = errors.New("server already serving")

// ErrClosed is returned by [Server.Listen] and [Server.Serve] after
// [Server.Drain].
var ErrClosed = errors.New("server: drained")

// ErrNoAddr is returned by [Server.Listen] and [Server.Serve] when there
// is nothing to listen on: no [Config.Listener], and neither
// [Config.Addr] nor [Server.SetPort] gave an address.
var ErrNoAddr = errors.New("server: no address to listen on: Config.Addr is empty, and neither Config.Listener nor SetPort gave one")

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

// Server is a gRPC server and an HTTP server on one port. Create it with
// [New], [Server.Declare] its gRPC services, [Server.Serve] it, bind the
// implementations with [Server.Bind] when they are ready and
// [Server.Drain] it at the end. All methods are safe for concurrent use.
type Server struct {
	cfg  Config
	gate Gate
	grpc *grpc.Server
	http *http.Server
	mux  *http.ServeMux
	// httpConns follows the HTTP connections for the drain.
	httpConns httpConns
	// conns admits connections within the limits and counts them.
	conns *connGate

	draining atomic.Bool // new application calls are refused
	handover atomic.Bool // see DrainForHandover
	noDelay  atomic.Bool // see SkipDrainDelay

	mu        sync.Mutex
	services  map[string]*service
	routes    map[string]*route // declared HTTP routes, by pattern
	reserved  []reservation     // paths Handle and DeclareHTTP refuse
	lis       *trackingListener // nil before Listen
	cm        cmux.CMux
	serving   bool
	drainDone chan struct{} // closed when Drain finished; nil before
	drainErr  error
	hurry     context.Context // ends when a Drain caller's ctx ended
	hurryUp   context.CancelFunc
	serveErr  error
	wg        sync.WaitGroup // the serving goroutines
	done      chan struct{}  // see Done
	doneOnce  sync.Once
}

// New returns a server that is not listening yet. It registers the health
// service (when [Config.Health] is set) and server reflection on the gRPC
// server, and mounts the health endpoints on the HTTP server.
func New(cfg Config) (*Server, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	tc, err := tlsConfig(cfg.TLS, cfg.RequireClientCert)
	if err != nil {
		return nil, err
	}
	cfg.TLS = tc
	// The limits first: options given in GRPCOptions override them.
	opts := append(cfg.Limits.grpcOptions(cfg.IdleTimeout), cfg.GRPCOptions...)
	switch {
	case tc != nil:
		opts = append(slices.Clip(opts), grpc.Creds(terminatedTLS{}))
	case isUnix(cfg.Listener):
		opts = append(slices.Clip(opts), grpc.Creds(unixCreds{}))
	}
	s := &Server{
		cfg:      cfg,
		gate:     cfg.Gate,
		grpc:     grpc.NewServer(opts...),
		mux:      http.NewServeMux(),
		services: make(map[string]*service),
		routes:   make(map[string]*route),
		done:     make(chan struct{}),
		conns:    newConnGate(cfg.Limits, cfg.Logger),
	}
	s.http = &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if c, ok := r.Context().Value(connKey{}).(net.Conn); ok {
				s.httpConns.handling(c)
			}
			s.mux.ServeHTTP(w, r)
		}),
		ConnState:         s.httpConns.track,
		ReadHeaderTimeout: noBound(cfg.ReadHeaderTimeout),
		ReadTimeout:       cfg.ReadTimeout,
		WriteTimeout:      cfg.WriteTimeout,
		IdleTimeout:       noBound(cfg.IdleTimeout),
		MaxHeaderBytes:    cfg.MaxHeaderBytes,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, connKey{}, c)
		},
	}
	if cfg.Health != nil {
		cfg.Health.Register(s.grpc)
		health.NewHandler(cfg.Health).Mount(s.mux)
		s.reserved = healthReservations()
	}
	if !cfg.DisableReflection {
		reflection.Register(s.grpc)
	}
	return s, nil
}

// OnShutdown registers f to be called, in a goroutine of its own, when the
// drain stops taking requests (after the drain delay). A handler that
// streams until something else ends (an event stream, a long poll) ends
// there: the drain waits for every handler to return, up to its stop
// timeout. Register before the drain begins.
func (s *Server) OnShutdown(f func()) { s.http.RegisterOnShutdown(f) }

// Handle registers an HTTP handler for pattern (http.ServeMux syntax). It
// may be called at any time, also while serving. It fails, instead of
// panicking like ServeMux, on an invalid pattern or one that conflicts
// with a registered one, and with a [*ReservedPathError] on a path the
// framework serves itself (the health endpoints, and what the daemon
// reserved with [Server.Reserve]). The route is not
// gated: see [Server.DeclareHTTP] for routes that must wait for the daemon.
func (s *Server) Handle(pattern string, h http.Handler) error {
	s.mu.Lock()
	err := s.checkReservedLocked(pattern)
	s.mu.Unlock()
	if err == nil {
		err = s.handle(pattern, h)
	}
	if err != nil {
		return fmt.Errorf("server: Handle %q: %w", pattern, err)
	}
	return nil
}

// handle is mux.Handle with its panics turned into errors.
func (s *Server) handle(pattern string, h http.Handler) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("%v", v)
		}
	}()
	s.mux.Handle(pattern, h)
	return nil
}

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
	s.lis = newTrackingListener(l, s.conns)
	return l.Addr(), nil
}

// ConnStats returns what the accept loop went through: connections open,
// refused over the [Limits], accepts that failed for want of resources,
// and when the server last could not take a connection.
func (s *Server) ConnStats() ConnStats { return s.conns.stats() }

// GetServiceInfo returns the gRPC services the server serves, declared ones
// included, as grpc.Server.GetServiceInfo does.
func (s *Server) GetServiceInfo() map[string]grpc.ServiceInfo { return s.grpc.GetServiceInfo() }

// Addr returns the bound address, or nil before [Server.Listen].
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lis == nil {
		return nil
	}
	return s.lis.Addr()
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
		// The handshake happens on cmux's first read, so the sniff timeout
		// bounds a client that never completes it.
		base = tls.NewListener(s.lis, s.cfg.TLS)
	}
	m := cmux.New(base)
	m.SetReadTimeout(s.cfg.SniffTimeout)
	// gRPC clients wait for the server's SETTINGS frame before they send
	// their headers, so the matcher must send it.
	grpcL := handoffListener{m.MatchWithWriters(cmux.HTTP2MatchHeaderFieldSendSettings("content-type", "application/grpc"))}
	httpL := handoffListener{m.Match(sentSomething)}
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

// handOver lets the socket live on in the new image, which serves the
// connections queued in its backlog: it stops taking them without dropping
// one already taken, and lets the multiplexer hand the ones it is still
// sniffing to the servers (a silent one for at most SniffTimeout). It
// reports whether the sniffing ended in time.
//
// Then it lets the clients of fresh connections close them: a checker's
// connection carries one call and is closed by the checker a moment after
// the answer. A server that closes first (a graceful stop ends a connection
// once its calls are done) has the client's last frames unread in its
// socket, and the kernel answers with a reset that can cost the client the
// answer. Older connections, long-lived clients', are stopped gracefully
// afterwards: they see GOAWAY and reconnect, to the backlog.
func (s *Server) handOver(stopCtx context.Context, lis *trackingListener) bool {
	lis.stopAccepting()
	sniffed := s.waitSniffed(lis)
	waitFresh(stopCtx, lis, freshConn)
	return sniffed
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

// sentSomething matches every connection that sent at least one byte
// within the sniff timeout: the HTTP server answers what is not HTTP with
// 400. One that sent nothing matches no listener, and the multiplexer
// closes it. cmux.Any would hand it to the HTTP server, whose Shutdown takes
// a connection that never sent a byte for an active one during its first 5 s
// and so waits for it for up to the whole stop timeout.
func sentSomething(r io.Reader) bool {
	var b [1]byte
	n, _ := r.Read(b[:])
	return n > 0
}

// freshConn is how young a connection is that a handover waits for its
// client to close, and for how long at most.
const freshConn = time.Second

// waitFresh waits until every connection lis took in the last age is
// closed, for at most age, or until ctx ends.
func waitFresh(ctx context.Context, lis *trackingListener, age time.Duration) {
	now := time.Now()
	ctx, cancel := context.WithTimeout(ctx, age)
	defer cancel()
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for lis.openSince(now.Add(-age)) > 0 {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// waitSniffed waits until no connection is being sniffed any more, for at
// most SniffTimeout (StopTimeout when that is zero; no bound when both are),
// unless hurried.
func (s *Server) waitSniffed(lis *trackingListener) bool {
	bound := s.cfg.SniffTimeout
	if bound == 0 {
		bound = s.cfg.StopTimeout
	}
	deadline := time.Now().Add(bound)
	for !lis.parked.Load() || lis.sniffing() > 0 {
		if bound > 0 && time.Now().After(deadline) {
			return false
		}
		if !s.waitFor(nil, 5*time.Millisecond) {
			return false
		}
	}
	return true
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
