package control

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
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
	// Reads names the service's other methods. [Guard.Tap] sees calls of
	// any name: it audits and counts a refusal only under a name listed
	// here or in Mutating, so that callers cannot add names to the metric.
	Reads []string
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
	policy   *AccessPolicy
	opts     GuardOptions
	log      *slog.Logger
	calls    metric.Int64Counter
	mutating map[string]bool
	methods  map[string]bool // Mutating and Reads
	limits   *limiters
}

// NewGuard returns a Guard that enforces p. p must have been resolved
// ([LoadPolicy], [ParsePolicy] or [AccessPolicy.Resolve]) and is not changed
// afterwards; a rate the limiter cannot keep (NaN, infinite, negative) is
// refused with [ErrPolicy].
func NewGuard(p *AccessPolicy, opts GuardOptions) (*Guard, error) {
	if opts.Service == "" {
		return nil, errors.New("control: GuardOptions.Service is required")
	}
	if err := checkRate(p.Rate); err != nil {
		return nil, err
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
	g := &Guard{policy: p, opts: opts, log: log, calls: calls, limits: newLimiters(p.Rate),
		mutating: map[string]bool{}, methods: map[string]bool{}}
	for _, m := range opts.Mutating {
		g.mutating[m], g.methods[m] = true, true
	}
	for _, m := range opts.Reads {
		g.methods[m] = true
	}
	return g, nil
}

// Intercept is the guard as a grpc.UnaryServerInterceptor: chain it on
// every server that serves the guarded service.
func (g *Guard) Intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	method, ok := g.method(info.FullMethod)
	if !ok {
		return handler(ctx, req)
	}
	var resp any
	err := g.Call(ctx, method, func(ctx context.Context) error {
		var err error
		resp, err = handler(ctx, req)
		return err
	})
	return resp, err
}

// Call is the guard around one call of method that does not come as a
// gRPC call (a JSON route of the control socket): the caller identified
// from ctx, taken from its rate unless a tap took the call already,
// refused when the policy grants it nothing, and call run with its
// [Caller]; the audit line and the metric are written as for a gRPC call,
// under method, which should be one [GuardOptions] names. Its error is
// the refusal or call's, a gRPC status error (or one converted to
// Unknown).
func (g *Guard) Call(ctx context.Context, method string, call func(ctx context.Context) error) error {
	a := &audit{}
	ctx = context.WithValue(ctx, auditKey{}, a)
	pr, err := Identify(ctx)
	if err != nil {
		err = status.Error(codes.Unauthenticated, err.Error())
	} else if !charged(ctx) {
		// Unless the surface's tap took this call from the rate already.
		err = g.spend(pr)
	}
	if err == nil {
		err = g.admit(ctx, pr, call)
	}
	g.record(ctx, method, pr, a, err)
	return err
}

// admit refuses pr when the policy grants it nothing, and otherwise runs
// call with its Caller.
func (g *Guard) admit(ctx context.Context, pr Principal, call func(ctx context.Context) error) error {
	grant := g.policy.Grant(pr)
	if grant.Empty() {
		return errNothingGranted(pr)
	}
	ctx = context.WithValue(ctx, chargeKey{}, func(n int) error { return g.charge(pr, n) })
	return call(WithCaller(ctx, Caller{Principal: pr, Grant: grant}))
}

type chargeKey struct{}

// Charge spends n more calls of the caller's rate, on top of the one every
// call spends, for a call that costs the daemon as much as n calls would
// (an egress policy of thousands of ranges): nil, or ResourceExhausted
// when the caller's bucket does not hold them, and nothing is spent then.
// n is capped so that the call and its charge fit in the bucket: any call
// the guard admits can be made once the bucket is full. Root has no rate, and outside a call
// the Guard admitted Charge does nothing.
func Charge(ctx context.Context, n int) error {
	if f, ok := ctx.Value(chargeKey{}).(func(int) error); ok && n > 0 {
		return f(n)
	}
	return nil
}

// errNothingGranted refuses a principal no rule grants anything.
func errNothingGranted(pr Principal) error {
	return status.Errorf(codes.PermissionDenied, "%s may do nothing on the control surface: no rule of the daemon's control policy grants it anything", pr)
}

// method returns the method name of a call of the guarded service.
func (g *Guard) method(fullMethod string) (string, bool) {
	return strings.CutPrefix(fullMethod, "/"+g.opts.Service+"/")
}

// spend takes one call from pr's rate: nil, or ResourceExhausted when its
// bucket is empty. Root has no rate.
func (g *Guard) spend(pr Principal) error { return g.spendN(pr, 1) }

// charge takes n more calls from pr's rate for a call that already spent
// its own: at most what is left of a full bucket.
func (g *Guard) charge(pr Principal, n int) error {
	if g.limits != nil {
		n = min(n, g.limits.burst()-1)
	}
	if n <= 0 {
		return nil
	}
	return g.spendN(pr, n)
}

// spendN takes n calls from pr's rate (at most a bucket's worth).
func (g *Guard) spendN(pr Principal, n int) error {
	if _, err := g.take(pr, n); err != nil {
		return status.Error(codes.ResourceExhausted, err.Error())
	}
	return nil
}

// take is spend's work: the refusal, and how long until the bucket holds
// n calls again.
func (g *Guard) take(pr Principal, n int) (time.Duration, error) {
	if pr.IsRoot() {
		return 0, nil
	}
	if wait := g.limits.take(pr.String(), time.Now(), n); wait > 0 {
		return wait, fmt.Errorf("%s: rate limit of %g calls a second exceeded: retry later", pr, g.policy.Rate)
	}
	return 0, nil
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

// burst is how many calls a principal may make at once: twice its rate,
// within what an int holds whatever the rate.
func (l *limiters) burst() int { return int(max(1, min(2*float64(l.rate), math.MaxInt32))) }

// take spends n calls of key's bucket (at most the burst): 0, or how long
// until the bucket holds them, when it does not (and nothing is spent).
func (l *limiters) take(key string, now time.Time, n int) time.Duration {
	if l == nil {
		return 0
	}
	n = min(n, l.burst())
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
	r := b.ReserveN(now, n)
	if wait := r.DelayFrom(now); wait > 0 {
		r.CancelAt(now)
		return wait
	}
	return 0
}
