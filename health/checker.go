package health

import (
	"context"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpchealth "google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/lifecycle/history"
)

// PhaseServicePrefix starts the grpc.health.v1 service name of every phase:
// the phase "reclaim" is reported as "phasegate.phase.reclaim".
const PhaseServicePrefix = "phasegate.phase."

// Options configure a [Checker]. The zero value is usable.
type Options struct {
	// Version is reported as "version" in /health bodies.
	Version string
	// ServiceID and Description are reported as "serviceId" and
	// "description" in /health bodies when set.
	ServiceID   string
	Description string
	// Services names application gRPC services (full names such as
	// "slots.v1.Slots") to report from the start. Each is NOT_SERVING until
	// it is marked ready with [Checker.SetServiceReady] and the lifecycle
	// serves. A server that declares services marks them itself.
	Services []string
	// OnHTTPCheck, when set, is called after every answer of a [Handler]
	// with the endpoint's path (PathHealth, PathLivez, PathReadyz or
	// PathStartupz) and the status code sent, for metrics. It must be
	// quick and safe for concurrent use.
	OnHTTPCheck func(path string, code int)
	// Usual, when set, says what a phase (or, with task, a background
	// task) usually takes, from the start history: /health shows it
	// beside each step's duration, and flags a step much slower than
	// usual.
	Usual func(name string, task bool) (history.Usual, bool)
}

// Checker follows a lifecycle and keeps a grpc-go health server in step with
// it. It is the state the HTTP [Handler] reads too, so gRPC and HTTP checks
// always agree. Create one with [New] before the port accepts connections
// and stop it with [Checker.Close].
//
// grpc-go's health server starts with "" SERVING; New sets it NOT_SERVING
// before it returns, so no client ever sees a daemon that is still starting
// as ready. grpc-go's List refuses to answer (ResourceExhausted) for more
// than 100 services: "" plus one entry per phase and per application
// service must stay within that.
type Checker struct {
	lc   *lifecycle.Lifecycle
	opts Options
	srv  *grpchealth.Server

	// closing ends Watch streams: a Watch never ends by itself, and a
	// graceful gRPC stop would wait for it until its deadline.
	closing     context.Context
	closeCancel context.CancelFunc
	unsubscribe func()
	done        chan struct{} // closed when the follower goroutine returned
	closeOnce   sync.Once

	// shutdown is read by every HTTP check without c.mu: under thousands
	// of checks a second on a saturated host, a mutex on that path turns
	// into a convoy (one preempted holder, all others queued behind it).
	shutdown atomic.Bool

	mu      sync.Mutex
	snap    lifecycle.Snapshot
	ready   map[string]bool                                       // application services
	applied map[string]healthpb.HealthCheckResponse_ServingStatus // last status set per service
}

// New returns a checker that follows lc. The statuses already reflect lc's
// current state when New returns; from then on one goroutine, owned by the
// checker and stopped by [Checker.Close], applies every change.
func New(lc *lifecycle.Lifecycle, opts Options) *Checker {
	ctx, cancel := context.WithCancel(context.Background())
	c := &Checker{
		lc:          lc,
		opts:        opts,
		srv:         grpchealth.NewServer(),
		closing:     ctx,
		closeCancel: cancel,
		done:        make(chan struct{}),
		ready:       make(map[string]bool),
		applied:     make(map[string]healthpb.HealthCheckResponse_ServingStatus),
	}
	for _, name := range opts.Services {
		c.ready[name] = false
	}
	ch, unsubscribe := lc.Subscribe()
	c.unsubscribe = unsubscribe
	// Subscribe hands over the current snapshot at once: apply it before
	// returning so that "" is NOT_SERVING before anything can call Check.
	s := <-ch
	c.mu.Lock()
	c.snap = s
	c.applyLocked()
	c.mu.Unlock()
	go c.follow(ch)
	return c
}

// follow applies snapshots until the subscription is cancelled.
func (c *Checker) follow(ch <-chan lifecycle.Snapshot) {
	defer close(c.done)
	for s := range ch {
		c.mu.Lock()
		if s.Seq >= c.snap.Seq {
			c.snap = s
			c.applyLocked()
		}
		c.mu.Unlock()
	}
}

// applyLocked sets every status from the current view, touching only the
// ones that changed so that Watch streams see each transition once.
func (c *Checker) applyLocked() {
	v := view{snap: c.snap, shutdown: c.shutdown.Load()}
	set := func(service string, serving bool) {
		st := healthpb.HealthCheckResponse_NOT_SERVING
		if serving {
			st = healthpb.HealthCheckResponse_SERVING
		}
		if old, ok := c.applied[service]; ok && old == st {
			return
		}
		c.applied[service] = st
		c.srv.SetServingStatus(service, st)
	}
	// "" goes last: a client that sees it change and then checks another
	// service finds that one already up to date.
	ready := v.ready()
	for _, p := range c.snap.Phases {
		set(PhaseServicePrefix+p.Name, p.State == lifecycle.PhaseSucceeded)
	}
	for name, ok := range c.ready {
		set(name, ready && ok)
	}
	set("", ready)
}

// view returns the current view, read fresh from the lifecycle so that HTTP
// answers never lag behind it. It takes no lock of the checker's.
func (c *Checker) view() view {
	return view{snap: c.lc.Snapshot(), shutdown: c.shutdown.Load()}
}

// Ready reports whether the daemon takes work (the lifecycle serves and the
// checker was not shut down) and, either way, describes its state the way
// [Describe] does.
func (c *Checker) Ready() (bool, string) {
	v := c.view()
	return v.ready(), v.describe()
}

// SetServiceReady marks an application service as able to take calls or
// not, adding it to the reported services if it is new. The service is
// reported SERVING only while it is ready and the lifecycle serves. A server
// calls this when the service is declared (false) and when its
// implementation is bound (true).
func (c *Checker) SetServiceReady(service string, ready bool) {
	if service == "" {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ready[service] = ready
	c.applyLocked()
}

// Shutdown reports the daemon as not ready from now on, whatever the
// lifecycle says: "" and every application service become NOT_SERVING at
// once, and HTTP readiness fails. A server calls it first thing when it
// drains, so checks see the change before connections go away. It cannot be
// undone. Phase entries keep following their phases.
func (c *Checker) Shutdown() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.shutdown.Store(true)
	c.applyLocked()
}

// Close stops following the lifecycle and ends every Watch stream with
// codes.Unavailable; new Watch calls fail the same way. Check and List keep
// answering with the last statuses. Close is idempotent.
func (c *Checker) Close() {
	c.closeOnce.Do(func() {
		c.closeCancel()
		c.unsubscribe()
		<-c.done
	})
}

// Register registers the grpc.health.v1 service on s. Call it before s
// serves: grpc-go refuses (fatally) registrations after Serve.
func (c *Checker) Register(s grpc.ServiceRegistrar) {
	healthpb.RegisterHealthServer(s, &healthService{c: c})
}

// healthService serves grpc.health.v1 from the grpc-go health server,
// adding only the end of Watch streams at Close.
type healthService struct {
	healthpb.UnimplementedHealthServer
	c *Checker
}

func (h *healthService) Check(ctx context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	return h.c.srv.Check(ctx, req)
}

func (h *healthService) List(ctx context.Context, req *healthpb.HealthListRequest) (*healthpb.HealthListResponse, error) {
	return h.c.srv.List(ctx, req)
}

var errClosed = status.Error(codes.Unavailable, "health: server is shutting down")

func (h *healthService) Watch(req *healthpb.HealthCheckRequest, stream healthpb.Health_WatchServer) error {
	closing := h.c.closing
	if closing.Err() != nil {
		return errClosed
	}
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	stop := context.AfterFunc(closing, cancel)
	defer stop()
	ws := &watchStream{Health_WatchServer: stream, ctx: ctx, last: -1}
	err := h.c.srv.Watch(req, ws)
	if closing.Err() == nil || stream.Context().Err() != nil {
		return err
	}
	// Closed: the last change may have raced with the end of the stream.
	// Send it, so a watcher always sees the final status before the end.
	if resp, cerr := h.c.srv.Check(stream.Context(), req); cerr == nil && resp.Status != ws.last {
		_ = stream.Send(resp)
	}
	return errClosed
}

// watchStream gives a Watch stream a context that also ends at Close, and
// remembers the last status sent.
type watchStream struct {
	healthpb.Health_WatchServer
	ctx  context.Context
	last healthpb.HealthCheckResponse_ServingStatus
}

func (w *watchStream) Context() context.Context { return w.ctx }

func (w *watchStream) Send(m *healthpb.HealthCheckResponse) error {
	w.last = m.Status
	return w.Health_WatchServer.Send(m)
}
