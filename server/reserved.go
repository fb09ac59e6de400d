package server

import (
	"fmt"
	"strings"

	"github.com/phasegate/phasegate/health"
)

// ReservedPathError is the error of [Server.Handle] and [Server.DeclareHTTP]
// for a pattern on a path that the framework serves itself. Such a pattern
// would not fail in http.ServeMux: one with a method ("GET /health") is
// more specific than the framework's and would silently take its requests,
// hiding health from checkers.
type ReservedPathError struct {
	Pattern string // as given
	Path    string // the reserved path, or subtree ending in "/", it falls on
	Owner   string // who serves it, such as "the health endpoints"
}

func (e *ReservedPathError) Error() string {
	return fmt.Sprintf("%s is reserved for %s", e.Path, e.Owner)
}

// reservation is a path the framework serves: exactly, or, for a path
// ending in "/", the path without it and everything under it.
type reservation struct {
	path  string
	owner string
}

// reservedBy returns the reservation pattern's path falls on, if any.
func reservedBy(rs []reservation, pattern string) (reservation, bool) {
	p := patternPath(pattern)
	for _, r := range rs {
		if sub, ok := strings.CutSuffix(r.path, "/"); ok {
			if p == sub || strings.HasPrefix(p, r.path) {
				return r, true
			}
			continue
		}
		if p == r.path {
			return r, true
		}
	}
	return reservation{}, false
}

// patternPath is the path of an http.ServeMux pattern, "[METHOD ][HOST]/PATH":
// the method and host are dropped, since a pattern with either still
// takes requests for the path. A trailing "{$}" is dropped too.
func patternPath(pattern string) string {
	p := pattern
	if i := strings.IndexAny(p, " \t"); i >= 0 {
		p = strings.TrimLeft(p[i:], " \t")
	}
	if i := strings.Index(p, "/"); i >= 0 {
		p = p[i:]
	}
	return strings.TrimSuffix(p, "{$}")
}

// healthReservations are the paths the health endpoints take (see
// [health.Handler.Mount]).
func healthReservations() []reservation {
	const owner = "the health endpoints"
	return []reservation{
		{health.PathHealth, owner},
		// Served with their subtrees: /readyz/<service> and the like.
		{health.PathLivez + "/", owner},
		{health.PathReadyz + "/", owner},
		{health.PathStartupz + "/", owner},
	}
}

// Reserve makes path one that [Server.Handle] and [Server.DeclareHTTP]
// refuse from now on with a [*ReservedPathError] naming owner: a daemon
// built on the server reserves the pages it serves itself, after
// registering them. A path ending in "/" reserves the path without it and
// every path under it; another reserves just itself.
// The health endpoints are reserved from [New] on, when Config.Health is
// set.
func (s *Server) Reserve(path, owner string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reserved = append(s.reserved, reservation{path, owner})
}

// checkReservedLocked returns a *ReservedPathError when pattern falls on
// a reserved path. s.mu is held.
func (s *Server) checkReservedLocked(pattern string) error {
	if r, ok := reservedBy(s.reserved, pattern); ok {
		return &ReservedPathError{Pattern: pattern, Path: r.path, Owner: r.owner}
	}
	return nil
}
