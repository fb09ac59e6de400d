// Package jsonroute holds what the daemon's JSON routes on the control socket share.
//
// The CNI plugin's routes (phases/cniapi) and the held slots' (phases)
// are each a table of [Route]s, declared once: the socket declares their
// patterns, the guard names their methods ([Methods]), the daemon binds
// their calls, which decode the request strictly ([Decode]) and answer
// with [Write].
package jsonroute

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strconv"
)

// Route is one JSON route: its pattern on the server's mux, the method
// name the guard audits it under, whether it changes anything, and its
// call on the request's body.
type Route struct {
	Pattern  string
	Method   string
	Mutating bool
	Call     func(ctx context.Context, body []byte) (any, error)
}

// Methods returns the guard's method names of routes, mutating and not.
func Methods(routes []Route) (mutating, reads []string) {
	for _, r := range routes {
		if r.Mutating {
			mutating = append(mutating, r.Method)
		} else {
			reads = append(reads, r.Method)
		}
	}
	return mutating, reads
}

// Decode adapts fn to a route's call: the request decoded strictly (an
// unknown field is refused, with the error refuse makes of the message).
func Decode[Req, Ans any](fn func(context.Context, Req) (Ans, error), refuse func(msg string) error) func(context.Context, []byte) (any, error) {
	return func(ctx context.Context, body []byte) (any, error) {
		var req Req
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			return nil, refuse("decode the request: " + err.Error())
		}
		return fn(ctx, req)
	}
}

// Write answers v with its length, so that a client reads a plain body.
func Write(w http.ResponseWriter, code int, v any) {
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
