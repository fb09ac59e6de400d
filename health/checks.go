package health

import (
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/phasegate/phasegate/lifecycle"
)

// check is one named check of a kube-style endpoint.
type check struct {
	name   string
	ok     bool
	warn   bool   // ok, but worth a look: a lifecycle warning
	detail string // why not, when !ok; what is wrong, when warn
}

// checkLifecycle is the name of the check that reads the lifecycle state.
const checkLifecycle = "lifecycle"

// checksFor lists an endpoint's checks against v.
func checksFor(endpoint string, v view) []check {
	var ok bool
	switch endpoint {
	case PathLivez:
		return appendWarnings([]check{{name: checkLifecycle, ok: v.live(), detail: v.describe()}}, v)
	case PathReadyz:
		ok = v.ready()
	case PathStartupz:
		ok = v.startedUp()
	}
	out := make([]check, 0, 1+len(v.snap.Phases)+len(v.snap.Warnings))
	out = append(out, check{name: checkLifecycle, ok: ok, detail: v.describe()})
	for _, p := range v.snap.Phases {
		out = append(out, check{name: "phase/" + p.Name, ok: p.State == lifecycle.PhaseSucceeded, detail: checkDetail(p)})
	}
	if endpoint == PathReadyz {
		out = appendWarnings(out, v)
	}
	return out
}

// appendWarnings adds a check that never fails for each warning.
func appendWarnings(out []check, v view) []check {
	for _, w := range v.snap.Warnings {
		out = append(out, check{name: "warning/" + w.Name, ok: true, warn: true, detail: oneLine(warningDetail(w, v.snap, true))})
	}
	return out
}

// renderChecks answers /livez, /readyz and /startupz the way kube-apiserver
// does, with 503 instead of 500 for a failure.
func renderChecks(endpoint, only string, v view, q url.Values) (int, []byte) {
	checks := checksFor(endpoint, v)
	name := strings.TrimPrefix(endpoint, "/")

	if only != "" {
		for _, c := range checks {
			if c.name != only {
				continue
			}
			if c.warn {
				return http.StatusOK, fmt.Appendf(nil, "warn: %s\n", c.detail)
			}
			if c.ok {
				return http.StatusOK, []byte("ok")
			}
			return http.StatusServiceUnavailable, fmt.Appendf(nil, "[-]%s %s\n%s check failed\n", c.name, c.detail, name)
		}
		return http.StatusNotFound, fmt.Appendf(nil, "%s: no check named %q\n", name, only)
	}

	excluded := make(map[string]bool)
	for _, e := range q["exclude"] {
		for _, n := range strings.Split(e, ",") {
			if n = strings.TrimSpace(n); n != "" {
				excluded[n] = false // becomes true once it matched a check
			}
		}
	}
	failed := false
	for _, c := range checks {
		if _, ex := excluded[c.name]; ex {
			excluded[c.name] = true
			continue
		}
		failed = failed || !c.ok
	}
	if !failed && !q.Has("verbose") {
		return http.StatusOK, []byte("ok")
	}

	var b strings.Builder
	for _, c := range checks {
		switch _, ex := excluded[c.name]; {
		case ex:
			fmt.Fprintf(&b, "[+]%s excluded: ok\n", c.name)
		case c.warn:
			fmt.Fprintf(&b, "[+]%s warn: %s\n", c.name, c.detail)
		case c.ok:
			fmt.Fprintf(&b, "[+]%s ok\n", c.name)
		default:
			fmt.Fprintf(&b, "[-]%s %s\n", c.name, c.detail)
		}
	}
	var unknown []string
	for n, matched := range excluded {
		if !matched {
			unknown = append(unknown, fmt.Sprintf("%q", n))
		}
	}
	if len(unknown) > 0 {
		slices.Sort(unknown)
		fmt.Fprintf(&b, "warn: some health checks cannot be excluded: no matches for %s\n", strings.Join(unknown, ","))
	}
	if failed {
		fmt.Fprintf(&b, "%s check failed\n", name)
		return http.StatusServiceUnavailable, []byte(b.String())
	}
	fmt.Fprintf(&b, "%s check passed\n", name)
	return http.StatusOK, []byte(b.String())
}
