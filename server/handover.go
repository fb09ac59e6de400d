package server

import (
	"errors"
	"fmt"
	"os"
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
