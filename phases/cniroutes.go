package phases

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"

	cniv1 "github.com/phasegate/phasegate/api/cni/v1"
	"github.com/phasegate/phasegate/control"
	"github.com/phasegate/phasegate/lifecycle"
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
func cniRoutes(c *cniService) []cniRoute {
	del := func(ctx context.Context, r cniv1.DelRequest) (struct{}, error) { return struct{}{}, c.del(ctx, r) }
	check := func(ctx context.Context, r cniv1.CheckRequest) (struct{}, error) { return struct{}{}, c.check(ctx, r) }
	return []cniRoute{
		{cniv1.PathAdd, "CNIAdd", true, jsonCall(c.add)},
		{cniv1.PathDel, "CNIDel", true, jsonCall(del)},
		{cniv1.PathGC, "CNIGC", true, jsonCall(c.gc)},
		{cniv1.PathCheck, "CNICheck", false, jsonCall(check)},
		{cniv1.PathStatus, "CNIStatus", false, jsonCall(c.status)},
	}
}

// cniMethods returns the guard's method names of the plugin's routes,
// mutating and not.
func cniMethods() (mutating, reads []string) {
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

// jsonCall adapts fn to a route's call: the request decoded strictly
// (an unknown field is refused, as the spec's decoding failure).
func jsonCall[Req, Ans any](fn func(context.Context, Req) (Ans, error)) func(context.Context, []byte) (any, error) {
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

// bindCNI binds the plugin's routes on the control socket behind its
// guard.
func (d *Daemon) bindCNI() error {
	c := &cniService{slots: d.slots, degraded: func() string { return warningsLine(d.lc.Snapshot()) }}
	for _, r := range cniRoutes(c) {
		if err := d.ctl.BindHTTP(r.pattern(), cniHandler(d.ctlGuard, r)); err != nil {
			return err
		}
	}
	return nil
}

// warningsLine names the lifecycle's warnings in one line, "" for none: what
// /health says when it says warn.
func warningsLine(s lifecycle.Snapshot) string {
	var out []string
	for _, w := range s.Warnings {
		out = append(out, w.Name+": "+w.Message)
	}
	return strings.Join(out, "; ")
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
			return err
		})
		if err != nil {
			ce := asCNI(err, cniv1.CodeIOFailure)
			writeJSON(w, httpStatus(ce.grpc), ce.e)
			return
		}
		writeJSON(w, http.StatusOK, answer)
	})
}

// writeJSON answers v with its length, so that the plugin reads a plain
// body.
func writeJSON(w http.ResponseWriter, code int, v any) {
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

// httpStatus is the HTTP status of an answer with gRPC code c: for a human
// with curl; the plugin reads the CNI code in the body.
func httpStatus(c codes.Code) int {
	switch c {
	case codes.InvalidArgument:
		return http.StatusBadRequest
	case codes.Unauthenticated:
		return http.StatusUnauthorized
	case codes.PermissionDenied:
		return http.StatusForbidden
	case codes.NotFound:
		return http.StatusNotFound
	case codes.AlreadyExists, codes.FailedPrecondition, codes.Aborted:
		return http.StatusConflict
	case codes.ResourceExhausted:
		return http.StatusTooManyRequests
	case codes.Unavailable:
		return http.StatusServiceUnavailable
	case codes.Canceled, codes.DeadlineExceeded:
		return http.StatusGatewayTimeout
	}
	return http.StatusInternalServerError
}
