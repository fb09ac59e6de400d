package server_test

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/phasegate/phasegate/server"
)

// Handle and DeclareHTTP refuse a pattern on a path the framework serves,
// naming it, however the pattern is spelled; paths beside the reserved
// ones stay open.
func TestReservedPathsAreRefused(t *testing.T) {
	st := newStack(t, server.DefaultConfig())
	st.srv.Reserve("/metrics", "the App")
	st.srv.Reserve("/debug/own/", "the App")
	tests := []struct {
		pattern  string
		reserved string // the reserved path named; "" when the pattern is allowed
	}{
		{"GET /health", "/health"},
		{"/health", "/health"},
		{"POST /health{$}", "/health"},
		{"example.com/health", "/health"},
		{"GET example.com/health", "/health"},
		{"GET /readyz", "/readyz/"},
		{"GET /readyz/x", "/readyz/"},
		{"/livez/", "/livez/"},
		{"GET /startupz", "/startupz/"},
		{"GET /metrics", "/metrics"},
		{"GET /debug/own", "/debug/own/"},
		{"GET /debug/own/page", "/debug/own/"},
		{"GET /healthz", ""},
		{"GET /health/extra", ""},
		{"GET /readyzz", ""},
		{"GET /metrics/extra", ""},
		{"GET /debug/slots", ""},
	}
	h := http.NotFoundHandler()
	for _, tt := range tests {
		for _, call := range []struct {
			name string
			f    func(string) error
		}{
			{"Handle", func(p string) error { return st.srv.Handle(p, h) }},
			{"DeclareHTTP", st.srv.DeclareHTTP},
		} {
			// Each spelling once per call: Handle and DeclareHTTP of the
			// same allowed pattern would conflict with each other.
			pattern := tt.pattern
			if call.name == "DeclareHTTP" && tt.reserved == "" {
				pattern = strings.Replace(pattern, "GET", "PUT", 1)
			}
			err := call.f(pattern)
			var re *server.ReservedPathError
			switch {
			case tt.reserved == "" && err != nil:
				t.Errorf("%s(%q) = %v, want nil", call.name, pattern, err)
			case tt.reserved != "" && (!errors.As(err, &re) || re.Path != tt.reserved):
				t.Errorf("%s(%q) = %v, want a *ReservedPathError for %s", call.name, pattern, err, tt.reserved)
			case tt.reserved != "" && !strings.Contains(err.Error(), tt.reserved+" is reserved for "):
				t.Errorf("%s(%q) = %q, want it to name %s as reserved", call.name, pattern, err, tt.reserved)
			}
		}
	}
}
