package cniapi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"google.golang.org/grpc/codes"

	cniv1 "github.com/phasegate/phasegate/api/cni/v1"
	"github.com/phasegate/phasegate/control"
	"github.com/phasegate/phasegate/phases/lease"
	"github.com/phasegate/phasegate/phases/slotsapi"
)

// maxCNIRequest bounds a CNI call's request: an egress policy of
// thousands of ranges fits.
const maxCNIRequest = 1 << 20

// cniRoute is one route of the CNI plugin on the control socket: its path,
// the method name the guard audits it under, and its call.
type cniRoute struct {
	path, method string
	mutating     bool
	call         func(ctx context.Context, body []byte) (any, error)
}

// cniRoutes is the table of the plugin's routes, declared once: the
// socket declares them, the guard names them, register binds them.
func cniRoutes(c *Service) []cniRoute {
	del := func(ctx context.Context, r cniv1.DelRequest) (struct{}, error) { return struct{}{}, c.del(ctx, r) }
	check := func(ctx context.Context, r cniv1.CheckRequest) (struct{}, error) { return struct{}{}, c.check(ctx, r) }
	return []cniRoute{
		{cniv1.PathAdd, "CNIAdd", true, JSONCall(c.add)},
		{cniv1.PathDel, "CNIDel", true, JSONCall(del)},
		{cniv1.PathGC, "CNIGC", true, JSONCall(c.gc)},
		{cniv1.PathCheck, "CNICheck", false, JSONCall(check)},
		{cniv1.PathStatus, "CNIStatus", false, JSONCall(c.status)},
	}
}

// Methods returns the guard's method names of the plugin's routes,
// mutating and not.
func Methods() (mutating, reads []string) {
	for _, r := range cniRoutes(nil) {
		if r.mutating {
			mutating = append(mutating, r.method)
		} else {
			reads = append(reads, r.method)
		}
	}
	return mutating, reads
}

// pattern is the route's pattern for the server's mux.
func (r cniRoute) pattern() string { return http.MethodPost + " " + r.path }

// JSONCall adapts fn to a route's call: the request decoded strictly
// (an unknown field is refused, as the spec's decoding failure).
func JSONCall[Req, Ans any](fn func(context.Context, Req) (Ans, error)) func(context.Context, []byte) (any, error) {
	return func(ctx context.Context, body []byte) (any, error) {
		var req Req
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			return nil, cniErr(codes.InvalidArgument, cniv1.CodeDecodingFailure, "decode the request: "+err.Error())
		}
		return fn(ctx, req)
	}
}

// Patterns returns the server's mux patterns of the plugin's routes, for
// the control socket to declare before the daemon serves them.
func Patterns() []string {
	var out []string
	for _, r := range cniRoutes(nil) {
		out = append(out, r.pattern())
	}
	return out
}

// Bind binds the plugin's routes over svc through bind (the control
// socket's server.BindHTTP), behind guard g; degraded says why the
// daemon serves with its datapath not whole, or "" (STATUS).
func Bind(bind func(pattern string, h http.Handler) error, g *control.Guard, svc *lease.Service, degraded func() string) error {
	c := &Service{slots: svc, degraded: degraded}
	for _, r := range cniRoutes(c) {
		if err := bind(r.pattern(), cniHandler(g, r)); err != nil {
			return err
		}
	}
	return nil
}

// cniHandler serves route r behind guard g: the caller identified, its
// rate spent and its grant checked before the body is read; the answer
// JSON, an error as the CNI spec's error object; one audit line for a
// mutating call, allowed or refused.
func cniHandler(g *control.Guard, r cniRoute) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		var answer any
		err := g.Call(req.Context(), r.method, func(ctx context.Context) error {
			body, err := io.ReadAll(http.MaxBytesReader(w, req.Body, maxCNIRequest))
			if err != nil {
				return cniErr(codes.InvalidArgument, cniv1.CodeDecodingFailure, fmt.Sprintf("read the request: %v", err))
			}
			answer, err = r.call(ctx, body)
			return slotsapi.Status(err)
		})
		if err != nil {
			ce := asCNI(err, cniv1.CodeIOFailure)
			WriteJSON(w, slotsapi.HTTPStatus(ce.grpc), ce.e)
			return
		}
		WriteJSON(w, http.StatusOK, answer)
	})
}

// WriteJSON answers v with its length, so that the plugin reads a plain
// body.
func WriteJSON(w http.ResponseWriter, code int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		code, b = http.StatusInternalServerError, []byte(`{"code":5,"msg":"encode the answer"}`)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write(b)
}
