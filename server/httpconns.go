package server

import (
	"net"
	"net/http"
	"sync"
	"time"
)

// stalledRequest is how long a drain lets an HTTP connection sit between
// its first byte and a complete request before closing it. Shutdown in
// net/http waits for every connection that has read a byte of a request,
// however slowly the rest comes (a slowloris client, one that sent half a
// request and went quiet): up to ReadHeaderTimeout, longer than any stop
// timeout. A client that is really sending a request, on a connection that
// was busy when the drain began, completes it well within this.
const stalledRequest = 250 * time.Millisecond

// httpConns follows the HTTP server's connections through their states
// (http.Server.ConnState), and whether a request on each has reached a
// handler, so that a drain can close those that have nothing to finish.
type httpConns struct {
	mu sync.Mutex
	m  map[net.Conn]*httpConn
}

type httpConn struct {
	state     http.ConnState
	since     time.Time
	inRequest bool // a handler was called since the connection was last idle
}

// track is the http.Server's ConnState hook.
func (h *httpConns) track(c net.Conn, st http.ConnState) {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch st {
	case http.StateHijacked, http.StateClosed:
		delete(h.m, c)
		return
	}
	if h.m == nil {
		h.m = make(map[net.Conn]*httpConn)
	}
	hc := h.m[c]
	if hc == nil {
		hc = &httpConn{}
		h.m[c] = hc
	}
	hc.state, hc.since = st, time.Now()
	if st == http.StateIdle {
		// The response was written whole: the next request starts
		// afresh.
		hc.inRequest = false
	}
}

// handling marks that a request on c reached a handler: from now until the
// connection is idle again, its response is on its way and a drain waits
// for it.
func (h *httpConns) handling(c net.Conn) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if hc := h.m[c]; hc != nil {
		hc.inRequest = true
	}
}

// closeStalled closes the connections that have read part of a request,
// or nothing yet, and no handler for longer than d.
func (h *httpConns) closeStalled(d time.Duration) {
	cutoff := time.Now().Add(-d)
	var stalled []net.Conn
	h.mu.Lock()
	for c, hc := range h.m {
		waiting := hc.state == http.StateNew || (hc.state == http.StateActive && !hc.inRequest)
		if waiting && hc.since.Before(cutoff) {
			stalled = append(stalled, c)
		}
	}
	h.mu.Unlock()
	for _, c := range stalled {
		_ = c.Close()
	}
}
