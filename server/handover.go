package server

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"
)

// ListenerFile returns a duplicate of the listening socket's descriptor,
// for handing the port to a new image of the process across an execve.
// The duplicate keeps the socket, and the connections queued in its
// backlog, alive after [Server.Drain] closes the server's own descriptor:
// clients that connect meanwhile wait for the new image instead of being
// refused. The caller owns the returned file.
func (s *Server) ListenerFile() (*os.File, error) {
	s.mu.Lock()
	lis := s.lis
	s.mu.Unlock()
	if lis == nil {
		return nil, errors.New("server: not listening")
	}
	fl, ok := lis.Listener.(interface{ File() (*os.File, error) })
	if !ok {
		return nil, fmt.Errorf("server: a %T cannot be handed over", lis.Listener)
	}
	f, err := fl.File()
	if err != nil {
		return nil, fmt.Errorf("server: duplicate the listening socket: %w", err)
	}
	return f, nil
}

// DrainForHandover makes the next [Server.Drain] hand the port over
// instead of closing it: the server stops accepting without dropping a
// connection it already took (a close of the listening socket can race
// with the kernel handing one over), finishes every connection it took,
// and leaves those still queued in the socket's backlog to the holder of
// the descriptor from [Server.ListenerFile]. Call it before Drain.
func (s *Server) DrainForHandover() { s.handover.Store(true) }

// handOver lets the socket live on in the new image, which serves the
// connections queued in its backlog: it stops taking them without dropping
// one already taken, and lets the multiplexer hand the ones it is still
// sniffing to the servers (a silent one for at most SniffTimeout). It
// reports whether the sniffing ended in time.
//
// Then it lets the clients of fresh connections close them: a checker's
// connection carries one call and is closed by the checker a moment after
// the answer. A server that closes first (a graceful stop ends a connection
// once its calls are done) has the client's last frames unread in its
// socket, and the kernel answers with a reset that can cost the client the
// answer. Older connections, long-lived clients', are stopped gracefully
// afterwards: they see GOAWAY and reconnect, to the backlog.
func (s *Server) handOver(stopCtx context.Context, lis *trackingListener) bool {
	lis.stopAccepting()
	sniffed := s.waitSniffed(lis)
	waitFresh(stopCtx, lis, freshConn)
	return sniffed
}

// waitSniffed waits until no connection is being sniffed any more, for at
// most SniffTimeout (StopTimeout when that is zero; no bound when both are),
// unless hurried.
func (s *Server) waitSniffed(lis *trackingListener) bool {
	bound := s.cfg.SniffTimeout
	if bound == 0 {
		bound = s.cfg.StopTimeout
	}
	deadline := time.Now().Add(bound)
	for !lis.parked.Load() || lis.sniffing() > 0 {
		if bound > 0 && time.Now().After(deadline) {
			return false
		}
		if !s.waitFor(nil, 5*time.Millisecond) {
			return false
		}
	}
	return true
}

// freshConn is how young a connection is that a handover waits for its
// client to close, and for how long at most.
const freshConn = time.Second

// waitFresh waits until every connection lis took in the last age is
// closed, for at most age, or until ctx ends.
func waitFresh(ctx context.Context, lis *trackingListener, age time.Duration) {
	now := time.Now()
	ctx, cancel := context.WithTimeout(ctx, age)
	defer cancel()
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for lis.openSince(now.Add(-age)) > 0 {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
