package cniapi

import (
	"context"
	"fmt"
	"io"
	"net/http"

	"google.golang.org/grpc/codes"

	cniv1 "github.com/phasegate/phasegate/api/cni/v1"
	"github.com/phasegate/phasegate/control"
	"github.com/phasegate/phasegate/phases/internal/jsonroute"
	"github.com/phasegate/phasegate/phases/lease"
	"github.com/phasegate/phasegate/phases/slotsapi"
)

// maxCNIRequest bounds a CNI call's request: an egress policy of
// thousands of ranges fits.
const maxCNIRequest = 1 << 20

// cniRoutes is the table of the plugin's routes, declared once: the
// socket declares them, the guard names them, register binds them.
func cniRoutes(c *Service) []jsonroute.Route {
	del := func(ctx context.Context, r cniv1.DelRequest) (struct{}, error) { return struct{}{}, c.del(ctx, r) }
	check := func(ctx context.Context, r cniv1.CheckRequest) (struct{}, error) { return struct{}{}, c.check(ctx, r) }
	return []jsonroute.Route{
		{Pattern: post(cniv1.PathAdd), Method: "CNIAdd", Mutating: true, Call: decode(c.add)},
		{Pattern: post(cniv1.PathDel), Method: "CNIDel", Mutating: true, Call: decode(del)},
		{Pattern: post(cniv1.PathGC), Method: "CNIGC", Mutating: true, Call: decode(c.gc)},
		{Pattern: post(cniv1.PathCheck), Method: "CNICheck", Call: decode(check)},
		{Pattern: post(cniv1.PathStatus), Method: "CNIStatus", Call: decode(c.status)},
	}
}

// post is the mux pattern of a route the plugin POSTs to.
func post(path string) string { return http.MethodPost + " " + path }

// decode adapts fn to a route's call, a request it cannot decode refused
// as the spec's decoding failure.
func decode[Req, Ans any](fn func(context.Context, Req) (Ans, error)) func(context.Context, []byte) (any, error) {
	return jsonroute.Decode(fn, func(msg string) error { return cniErr(codes.InvalidArgument, cniv1.CodeDecodingFailure, msg) })
}

// Methods returns the guard's method names of the plugin's routes,
// mutating and not.
func Methods() (mutating, reads []string) { return jsonroute.Methods(cniRoutes(nil)) }

// Patterns returns the server's mux patterns of the plugin's routes, for
// the control socket to declare before the daemon serves them.
func Patterns() []string {
	var out []string
	for _, r := range cniRoutes(nil) {
		out = append(out, r.Pattern)
	}
	return out
}

// Bind binds the plugin's routes over svc through bind (the control
// socket's server.BindHTTP), behind guard g; degraded says why the
// daemon serves with its datapath not whole, or "" (STATUS).
func Bind(bind func(pattern string, h http.Handler) error, g *control.Guard, svc *lease.Service, degraded func() string) error {
	c := &Service{slots: svc, degraded: degraded}
	for _, r := range cniRoutes(c) {
		if err := bind(r.Pattern, cniHandler(g, r)); err != nil {
			return err
		}
	}
	return nil
}

// cniHandler serves route r behind guard g: the caller identified, its
// rate spent and its grant checked before the body is read; the answer
// JSON, an error as the CNI spec's error object; one audit line for a
// mutating call, allowed or refused.
func cniHandler(g *control.Guard, r jsonroute.Route) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		var answer any
		err := g.Call(req.Context(), r.Method, func(ctx context.Context) error {
			body, err := io.ReadAll(http.MaxBytesReader(w, req.Body, maxCNIRequest))
			if err != nil {
				return cniErr(codes.InvalidArgument, cniv1.CodeDecodingFailure, fmt.Sprintf("read the request: %v", err))
			}
			answer, err = r.Call(ctx, body)
			return slotsapi.Status(err)
		})
		if err != nil {
			ce := asCNI(err, cniv1.CodeIOFailure)
			jsonroute.Write(w, slotsapi.HTTPStatus(ce.grpc), ce.e)
			return
		}
		jsonroute.Write(w, http.StatusOK, answer)
	})
}
