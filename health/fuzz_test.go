package health_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/phasegate/phasegate/lifecycle"
)

// FuzzHealthQuery sends arbitrary paths, query strings and methods to the
// health endpoints of a starting daemon: the handler must never answer 500
// or panic, must answer only 200, 404, 405 or 503 (or the mux's redirect to
// a cleaned path), and must keep
// Cache-Control: no-store.
func FuzzHealthQuery(f *testing.F) {
	for _, s := range []string{
		"/readyz?verbose", "/readyz?exclude=phase/reclaim&verbose", "/startupz?exclude=phase/lock,phase/reclaim",
		"/livez?exclude=", "/readyz/phase/reclaim", "/health?x=%zz", "/readyz?exclude=%00&verbose=1",
		"/readyz/../health", "/nope", "/health/", "//health",
	} {
		f.Add("GET", s)
	}
	f.Add("POST", "/health")
	f.Add("HEAD", "/readyz?verbose")
	f.Fuzz(func(t *testing.T, method, target string) {
		if !strings.HasPrefix(target, "/") || strings.ContainsAny(target, " \r\n#") || !isToken(method) {
			return // not a request line a server would parse
		}
		if _, err := url.ParseRequestURI(target); err != nil {
			return
		}
		_, _, h := rigIn(t, lifecycle.StateStarting)
		mux := http.NewServeMux()
		h.Mount(mux)
		w := get(mux, method, target)
		switch w.Code {
		case http.StatusOK, http.StatusNotFound, http.StatusMethodNotAllowed, http.StatusServiceUnavailable:
		case http.StatusMovedPermanently, http.StatusTemporaryRedirect, http.StatusPermanentRedirect:
			return // ServeMux cleaning the path ("//health" → "/health")
		default:
			t.Fatalf("%s %s: %d %s", method, target, w.Code, w.Body.String())
		}
		if w.Code != http.StatusNotFound && w.Header().Get("Cache-Control") != "no-store" {
			t.Fatalf("%s %s: Cache-Control %q", method, target, w.Header().Get("Cache-Control"))
		}
	})
}

// isToken reports whether s is an HTTP token (RFC 9110), as a method must be.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte("()<>@,;:\\\"/[]?={}", c) >= 0 {
			return false
		}
	}
	return true
}
