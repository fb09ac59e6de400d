package control

import (
	"context"
	"math"
	"net/http"
	"strconv"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
)

// A surface where every caller is a principal (the control socket) puts
// every route behind the guard's rate, the same bucket per principal for
// all of them: [Guard.Tap] for every gRPC call, known or not, before its
// request is read; [Guard.InterceptStream] for each further message of a
// stream (server reflection); [Guard.HTTP] for HTTP routes. [Guard.Intercept]
// does not spend again on a call the tap took.

// chargedKey marks the context of a call the tap took from the rate.
type chargedKey struct{}

// charged reports whether the tap took ctx's call from the rate.
func charged(ctx context.Context) bool {
	v, _ := ctx.Value(chargedKey{}).(bool)
	return v
}

// Tap is the guard's rate as a tap.ServerInHandle (grpc.InTapHandle): it
// takes every call of an identified principal from its rate before grpc
// reads the request, and refuses one past it with ResourceExhausted,
// audited when it is a call of a method of the guarded service that
// [GuardOptions] names. A call without credentials passes, for the
// interceptor to refuse with its reason.
func (g *Guard) Tap(ctx context.Context, info *tap.Info) (context.Context, error) {
	pr, err := Identify(ctx)
	if err != nil {
		return ctx, nil
	}
	if err := g.spend(pr); err != nil {
		if method, ok := g.method(info.FullMethodName); ok && g.methods[method] {
			g.record(ctx, method, pr, &audit{}, err)
		}
		return ctx, err
	}
	return context.WithValue(ctx, chargedKey{}, true), nil
}

// InterceptStream is the guard's rate as a grpc.StreamServerInterceptor:
// every message a principal sends on a stream is a call, the first one
// only if the tap did not take the stream already.
func (g *Guard) InterceptStream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	pr, err := Identify(ss.Context())
	if err != nil || pr.IsRoot() || g.limits == nil {
		return handler(srv, ss)
	}
	return handler(srv, &meteredStream{ServerStream: ss, g: g, pr: pr, free: charged(ss.Context())})
}

// meteredStream spends a call of its principal's rate on each message
// received.
type meteredStream struct {
	grpc.ServerStream
	g    *Guard
	pr   Principal
	free bool // the first message was paid for by the tap
}

// RecvMsg implements grpc.ServerStream: a message is paid for once it
// has come, so that a stream waiting for its next one is not refused for
// it.
func (s *meteredStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if s.free {
		s.free = false
		return nil
	}
	return s.g.spend(s.pr)
}

// HTTP puts h behind the guard: the caller identified (401 without
// credentials), taken from its rate (429 with Retry-After past it), refused
// when the policy grants it nothing (403); h reads the [Caller] with
// [CallerFrom]. Refusals are counted and audited as the gRPC calls' are,
// under the route's pattern.
func (g *Guard) HTTP(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		pr, err := IdentifyRequest(r)
		if err != nil {
			g.refuse(w, r, pr, http.StatusUnauthorized, status.Error(codes.Unauthenticated, err.Error()))
			return
		}
		if wait, err := g.take(pr, 1); err != nil {
			w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(wait.Seconds()))))
			g.refuse(w, r, pr, http.StatusTooManyRequests, status.Error(codes.ResourceExhausted, err.Error()))
			return
		}
		grant := g.policy.Grant(pr)
		if grant.Empty() {
			g.refuse(w, r, pr, http.StatusForbidden, errNothingGranted(pr))
			return
		}
		h.ServeHTTP(w, r.WithContext(WithCaller(r.Context(), Caller{Principal: pr, Grant: grant})))
	})
}

// refuse answers an HTTP request with code and err's message, and records
// it.
func (g *Guard) refuse(w http.ResponseWriter, r *http.Request, pr Principal, code int, err error) {
	g.record(r.Context(), r.Pattern, pr, &audit{}, err)
	http.Error(w, status.Convert(err).Message(), code)
}
