package server

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/phasegate/phasegate/health"
	"github.com/phasegate/phasegate/lifecycle"
)

// A Gate says whether application calls may be dispatched. The server asks
// it on every call to a declared service.
type Gate interface {
	// Allow returns nil when calls may be dispatched, or an error saying
	// why not. Its message is sent to the client with codes.Unavailable.
	Allow() error
}

// GateFunc adapts a function to a [Gate].
type GateFunc func() error

// Allow calls f.
func (f GateFunc) Allow() error { return f() }

// LifecycleGate is a [Gate] that is open while lc serves. When it is not,
// its error describes the lifecycle the way health endpoints do:
// "starting: phase reclaim 1200/5000 namespaces".
func LifecycleGate(lc *lifecycle.Lifecycle) Gate {
	return GateFunc(func() error {
		if lc.State() == lifecycle.StateServing {
			return nil
		}
		s := lc.Snapshot()
		if s.State == lifecycle.StateServing {
			return nil
		}
		return errors.New(health.Describe(s))
	})
}

// service is a declared service and its late-bound implementation.
type service struct {
	name        string
	handlerType reflect.Type // the interface an implementation must satisfy
	impl        atomic.Pointer[implBox]
}

type implBox struct{ v any }

// errNotBound is the reason given while a declared service has no
// implementation.
var errNotBound = errors.New("implementation not bound yet")

// Declare registers a gRPC service whose implementation is bound later with
// [Server.Bind]. It must be called before [Server.Serve]: grpc-go cannot
// register services once it serves. The service is registered at once with
// handlers that look the implementation up at call time, so
// GetServiceInfo and reflection list it from the start; calls fail with
// codes.Unavailable until it is bound and the gate is open.
//
// A refused call is refused before its request is decoded: stats handlers
// and stream interceptors see it, unary interceptors do not. Once admitted,
// a call runs through the generated handler exactly as if the
// implementation had been registered directly.
func (s *Server) Declare(desc *grpc.ServiceDesc) error {
	if desc == nil || desc.ServiceName == "" {
		return errors.New("server: Declare: service description without a name")
	}
	ht := reflect.TypeOf(desc.HandlerType)
	if ht == nil || ht.Kind() != reflect.Pointer || ht.Elem().Kind() != reflect.Interface {
		return fmt.Errorf("server: Declare %s: HandlerType must be a pointer to an interface", desc.ServiceName)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.serving || s.drainDone != nil {
		return fmt.Errorf("server: Declare %s: %w", desc.ServiceName, ErrServing)
	}
	if _, dup := s.services[desc.ServiceName]; dup {
		return fmt.Errorf("server: Declare %s: already declared", desc.ServiceName)
	}
	svc := &service{name: desc.ServiceName, handlerType: ht.Elem()}
	s.services[svc.name] = svc
	s.grpc.RegisterService(s.lateBound(desc, svc), svc)
	if s.cfg.Health != nil {
		s.cfg.Health.SetServiceReady(svc.name, false)
	}
	return nil
}

// lateBound copies desc with handlers that admit the call and then hand it,
// with the bound implementation, to the generated handler.
func (s *Server) lateBound(desc *grpc.ServiceDesc, svc *service) *grpc.ServiceDesc {
	out := &grpc.ServiceDesc{
		ServiceName: desc.ServiceName,
		// Any value satisfies the empty interface: the real check happens
		// in Bind, where it can return an error instead of killing the
		// process.
		HandlerType: (*any)(nil),
		Methods:     make([]grpc.MethodDesc, len(desc.Methods)),
		Streams:     make([]grpc.StreamDesc, len(desc.Streams)),
		Metadata:    desc.Metadata,
	}
	for i, m := range desc.Methods {
		h := m.Handler
		out.Methods[i] = grpc.MethodDesc{
			MethodName: m.MethodName,
			Handler: func(_ any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
				impl, err := s.admit(ctx, svc)
				if err != nil {
					return nil, err
				}
				return h(impl, ctx, dec, ic)
			},
		}
	}
	for i, st := range desc.Streams {
		h := st.Handler
		st.Handler = func(_ any, stream grpc.ServerStream) error {
			impl, err := s.admit(stream.Context(), svc)
			if err != nil {
				return err
			}
			return h(impl, stream)
		}
		out.Streams[i] = st
	}
	return out
}

// admit returns the implementation to call, or the status that says why
// the call may not be made: Unauthenticated without a required client
// certificate, Unavailable while there is nothing to call yet.
func (s *Server) admit(ctx context.Context, svc *service) (any, error) {
	if s.cfg.RequireClientCert {
		if err := checkClientCert(ctx, svc.name); err != nil {
			return nil, err
		}
	}
	if s.draining.Load() {
		return nil, status.Errorf(codes.Unavailable, "%s unavailable: %v", svc.name, errDraining)
	}
	if s.gate != nil {
		if err := s.gate.Allow(); err != nil {
			return nil, status.Errorf(codes.Unavailable, "%s unavailable: %v", svc.name, err)
		}
	}
	b := svc.impl.Load()
	if b == nil {
		return nil, status.Errorf(codes.Unavailable, "%s unavailable: %v", svc.name, errNotBound)
	}
	return b.v, nil
}

// Bind sets the implementation of a declared service, which may then take
// calls whenever the gate is open. It can be called at any time, also
// while serving, and again to replace the implementation. It fails when
// the service was not declared or impl does not implement it.
func (s *Server) Bind(service string, impl any) error {
	s.mu.Lock()
	svc, ok := s.services[service]
	s.mu.Unlock()
	if !ok {
		return fmt.Errorf("server: Bind %s: service not declared", service)
	}
	if impl == nil || !reflect.TypeOf(impl).Implements(svc.handlerType) {
		return fmt.Errorf("server: Bind %s: %T does not implement %v", service, impl, svc.handlerType)
	}
	svc.impl.Store(&implBox{v: impl})
	if s.cfg.Health != nil {
		s.cfg.Health.SetServiceReady(service, true)
	}
	return nil
}

// Binder returns a [grpc.ServiceRegistrar] that binds declared services
// instead of registering them: a service's generated Register function
// then binds it with an implementation the compiler checks against the
// service's interface, and a service named by its generated ServiceDesc,
// never by a string that a typo breaks only at run time:
//
//	b := srv.Binder()
//	catalogv1.RegisterCatalogServer(b, impl)
//	if err := b.Err(); err != nil { … }
//
// A hand-written ServiceDesc binds the same way: b.RegisterService(&desc,
// impl).
func (s *Server) Binder() *Binder { return &Binder{s: s} }

// Binder binds services through the [grpc.ServiceRegistrar] interface; see
// [Server.Binder]. It is not safe for concurrent use.
type Binder struct {
	s   *Server
	err error
}

// RegisterService binds impl as the implementation of the declared service
// desc describes, as [Server.Bind] does; an error is kept for [Binder.Err],
// since the interface returns none.
func (b *Binder) RegisterService(desc *grpc.ServiceDesc, impl any) {
	b.err = errors.Join(b.err, b.s.Bind(desc.ServiceName, impl))
}

// Err returns the errors of every RegisterService so far, joined; nil
// when each bound its service.
func (b *Binder) Err() error { return b.err }
