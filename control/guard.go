package control

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Caller is the principal of a call the [Guard] admitted, and what the
// policy grants it. Services read it with [CallerFrom].
type Caller struct {
	Principal Principal
	Grant     Grant
}

type callerKey struct{}

// CallerFrom returns the caller of a call the Guard admitted; false
// outside one, where a service must refuse.
func CallerFrom(ctx context.Context) (Caller, bool) {
	c, ok := ctx.Value(callerKey{}).(*Caller)
	if !ok {
		return Caller{}, false
	}
	return *c, true
}

// WithCaller returns ctx carrying c, as the Guard does: for a service
// called in-process (tests, a daemon's own tools) with a principal it has
// identified itself.
func WithCaller(ctx context.Context, c Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, &c)
}

// audit collects what a call's audit line names besides the principal and
// the outcome.
type audit struct {
	mu    sync.Mutex
	attrs []any
}

type auditKey struct{}

// Note adds key-value pairs (slog style: "owner", o, "slot", 3) to the
// audit line of the call ctx belongs to. Outside a guarded call it does
// nothing. Never note a secret: the line is logged as it is.
func Note(ctx context.Context, kv ...any) {
	if a, ok := ctx.Value(auditKey{}).(*audit); ok {
		a.mu.Lock()
		a.attrs = append(a.attrs, kv...)
		a.mu.Unlock()
	}
}

// GuardOptions configure a [Guard].
type GuardOptions struct {
	// Service is the full gRPC name of the service guarded
	// ("phasegate.v1.Slots"); calls of other services pass untouched.
	Service string
	// Mutating names the methods that change something: each call is
	// audited, allowed or refused. Other methods are audited when refused.
	Mutating []string
	// Surface names where calls arrive ("socket", "tcp") in the audit
	// line and the metric.
	Surface string
	// Logger receives the audit lines; nil discards them.
	Logger *slog.Logger
	// MeterProvider receives the calls metric; nil records none.
	MeterProvider metric.MeterProvider
}

// Guard is the gRPC interceptor in front of a control API: see the
// package documentation. Make it with [NewGuard].
type Guard struct {
	policy   *Policy
	opts     GuardOptions
	log      *slog.Logger
	calls    metric.Int64Counter
	mutating map[string]bool
	limits   *limiters
}

// NewGuard returns a Guard that enforces p. p must have been resolved
// ([LoadPolicy], [ParsePolicy] or [Policy.Resolve]) and is not changed
// afterwards.
func NewGuard(p *Policy, opts GuardOptions) (*Guard, error) {
	if opts.Service == "" {
		return nil, errors.New("control: GuardOptions.Service is required")
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	mp := opts.MeterProvider
	if mp == nil {
		mp = noop.NewMeterProvider()
	}
	calls, err := mp.Meter("github.com/phasegate/phasegate/control").Int64Counter("phasegate.control.calls",
		metric.WithUnit("{call}"),
		metric.WithDescription("Calls on the control surface, by method, surface and outcome (a gRPC code name)."))
	if err != nil {
		return nil, fmt.Errorf("control: %w", err)
	}
	g := &Guard{policy: p, opts: opts, log: log, calls: calls, mutating: map[string]bool{}, limits: newLimiters(p.Rate)}
	for _, m := range opts.Mutating {
		g.mutating[m] = true
	}
	return g, nil
}

// Intercept is the guard as a grpc.UnaryServerInterceptor: chain it on
// every server that serves the guarded service.
func (g *Guard) Intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	method, ok := strings.CutPrefix(info.FullMethod, "/"+g.opts.Service+"/")
	if !ok {
		return handler(ctx, req)
	}
	a := &audit{}
	ctx = context.WithValue(ctx, auditKey{}, a)
	pr, err := Identify(ctx)
	var resp any
	switch {
	case err != nil:
		err = status.Error(codes.Unauthenticated, err.Error())
	case !pr.IsRoot() && !g.limits.allow(pr.String(), time.Now()):
		err = status.Errorf(codes.ResourceExhausted, "%s: rate limit of %g calls a second exceeded: retry later", pr, g.policy.Rate)
	default:
		grant := g.policy.Grant(pr)
		if grant.Empty() {
			err = status.Errorf(codes.PermissionDenied, "%s may do nothing on the control surface: no rule of the daemon's control policy grants it anything", pr)
			break
		}
		resp, err = handler(WithCaller(ctx, Caller{Principal: pr, Grant: grant}), req)
	}
	g.record(ctx, method, pr, a, err)
	return resp, err
}

// record writes the call's audit line, when it has one, and counts it.
func (g *Guard) record(ctx context.Context, method string, pr Principal, a *audit, err error) {
	st := status.Convert(err)
	outcome := st.Code().String()
	g.calls.Add(ctx, 1, metric.WithAttributes(
		attribute.String("method", method), attribute.String("surface", g.opts.Surface), attribute.String("outcome", outcome)))
	if err == nil && !g.mutating[method] {
		return
	}
	attrs := []any{"method", method, "surface", g.opts.Surface, "principal", pr.String()}
	if pr.Kind == Unix {
		attrs = append(attrs, "pid", pr.PID)
	}
	a.mu.Lock()
	attrs = append(attrs, a.attrs...)
	a.mu.Unlock()
	attrs = append(attrs, "outcome", outcome)
	if err != nil {
		attrs = append(attrs, "reason", st.Message())
		g.log.Warn("control call refused", attrs...)
		return
	}
	g.log.Info("control call", attrs...)
}

// limiters hold one token bucket per principal. Buckets idle long enough
// to be full again are dropped, so the map holds only recent callers.
type limiters struct {
	rate  rate.Limit
	mu    sync.Mutex
	by    map[string]*limiter
	swept time.Time
}

type limiter struct {
	*rate.Limiter
	last time.Time
}

func newLimiters(perSecond float64) *limiters {
	if perSecond <= 0 {
		return nil
	}
	return &limiters{rate: rate.Limit(perSecond), by: map[string]*limiter{}}
}

// burst is how many calls a principal may make at once.
func (l *limiters) burst() int { return max(1, int(2*float64(l.rate))) }

func (l *limiters) allow(key string, now time.Time) bool {
	if l == nil {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	// A bucket refills in burst/rate: one idle for longer is full, the
	// same as a new one.
	full := time.Duration(float64(l.burst()) / float64(l.rate) * float64(time.Second))
	if now.Sub(l.swept) > full && len(l.by) > 0 {
		for k, v := range l.by {
			if now.Sub(v.last) > full {
				delete(l.by, k)
			}
		}
		l.swept = now
	}
	b := l.by[key]
	if b == nil {
		b = &limiter{Limiter: rate.NewLimiter(l.rate, l.burst())}
		l.by[key] = b
	}
	b.last = now
	return b.AllowN(now, 1)
}
