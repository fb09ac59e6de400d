package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/soheilhy/cmux"
	"google.golang.org/grpc"
	"google.golang.org/grpc/reflection"

	"github.com/phasegate/phasegate/health"
)

// ErrServing is returned by [Server.Declare] once the server serves or
// drains: grpc-go cannot register services after Serve.
var ErrServing = errors.New("server already serving")

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
		conns:    newConnGate(cfg.Limits, cfg.Admit, cfg.Logger),
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

// ConnStats returns what the accept loop went through: connections open,
// refused over the [Limits], accepts that failed for want of resources,
// and when the server last could not take a connection.
func (s *Server) ConnStats() ConnStats { return s.conns.stats() }

// GetServiceInfo returns the gRPC services the server serves, declared ones
// included, as grpc.Server.GetServiceInfo does.
func (s *Server) GetServiceInfo() map[string]grpc.ServiceInfo { return s.grpc.GetServiceInfo() }
