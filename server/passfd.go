package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// rightsConn is a connection on a Unix socket that takes the one
// descriptor its peer may pass (SCM_RIGHTS) with the connection's first
// bytes, for a handler to take ([TakePassedFD]). Its first read is a
// recvmsg with room for one descriptor: the kernel closes any more, and
// any passed with later bytes, which plain reads do not take.
type rightsConn struct {
	*net.UnixConn
	read atomic.Bool // the first bytes are read: plain reads from now on

	mu     sync.Mutex
	fd     int // the passed descriptor, until taken or closed; -1: none
	closed bool
}

func newRightsConn(c *net.UnixConn) *rightsConn { return &rightsConn{UnixConn: c, fd: -1} }

// Read reads the connection's first bytes with the descriptor passed on
// them, and the rest as they come.
func (c *rightsConn) Read(p []byte) (int, error) {
	if c.read.Load() {
		return c.UnixConn.Read(p)
	}
	oob := make([]byte, unix.CmsgSpace(4))
	// Go's recvmsg sets MSG_CMSG_CLOEXEC: the descriptor is never
	// inherited by what the daemon execs.
	n, oobn, _, _, err := c.UnixConn.ReadMsgUnix(p, oob)
	if oobn > 0 {
		c.keep(oob[:oobn])
	}
	if n > 0 {
		c.read.Store(true)
	}
	return n, err
}

// keep holds the first descriptor of the control messages in oob, and
// closes any other.
func (c *rightsConn) keep(oob []byte) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return
	}
	for _, m := range msgs {
		fds, err := unix.ParseUnixRights(&m)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			c.mu.Lock()
			if c.fd < 0 && !c.closed {
				c.fd, fd = fd, -1
			}
			c.mu.Unlock()
			if fd >= 0 {
				_ = unix.Close(fd)
			}
		}
	}
}

// take returns the passed descriptor, once; -1 when there is none.
func (c *rightsConn) take() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	fd := c.fd
	c.fd = -1
	return fd
}

// Close closes a descriptor passed and not taken, and the connection.
func (c *rightsConn) Close() error {
	c.mu.Lock()
	if c.fd >= 0 {
		_ = unix.Close(c.fd)
		c.fd = -1
	}
	c.closed = true
	c.mu.Unlock()
	return c.UnixConn.Close()
}

// rightsConnOf returns the Unix socket connection a request of ctx came
// on, or nil.
func rightsConnOf(ctx context.Context) *rightsConn {
	c, ok := ctx.Value(connKey{}).(net.Conn)
	if !ok {
		return nil
	}
	if tc := trackedConnOf(c); tc != nil {
		rc, _ := tc.Conn.(*rightsConn)
		return rc
	}
	return nil
}

// TakePassedFD returns the descriptor the peer passed (SCM_RIGHTS) with
// the first bytes of the Unix socket connection an HTTP request of ctx
// came on, and makes it the caller's to close: a second call returns -1.
// -1 when it passed none, or the connection is not a Unix socket's. What
// the descriptor is, is the caller's to check: it is whatever the peer
// could open and chose to pass.
func TakePassedFD(ctx context.Context) int {
	if rc := rightsConnOf(ctx); rc != nil {
		return rc.take()
	}
	return -1
}

// ErrNoPeerProcess is wrapped by [PeerPidfd]'s error when the kernel cannot
// name the connecting process: a TCP connection, or a kernel before
// SO_PEERPIDFD (Linux 6.5).
var ErrNoPeerProcess = errors.New("server: no pidfd of the peer")

// PeerPidfd returns a pidfd of the process that connected the Unix socket
// connection an HTTP request of ctx came on (SO_PEERPIDFD): the process
// the kernel recorded at connect time, as [PeerCred]'s pid, but pinned,
// so that it is never another that got the pid since. The process may
// have exited: pidfd_send_signal(2) on it then fails with ESRCH. The
// caller closes it.
func PeerPidfd(ctx context.Context) (int, error) {
	rc := rightsConnOf(ctx)
	if rc == nil {
		return -1, fmt.Errorf("%w: not a Unix socket connection", ErrNoPeerProcess)
	}
	raw, err := rc.SyscallConn()
	if err != nil {
		return -1, fmt.Errorf("server: peer pidfd: %w", err)
	}
	pidfd, opErr := -1, error(nil)
	if err := raw.Control(func(s uintptr) {
		pidfd, opErr = unix.GetsockoptInt(int(s), unix.SOL_SOCKET, unix.SO_PEERPIDFD)
	}); err != nil {
		return -1, fmt.Errorf("server: peer pidfd: %w", err)
	}
	switch {
	case errors.Is(opErr, syscall.ENOPROTOOPT):
		return -1, fmt.Errorf("%w: getsockopt SO_PEERPIDFD: %w (Linux 6.5 or later has it)", ErrNoPeerProcess, opErr)
	case opErr != nil:
		return -1, fmt.Errorf("server: getsockopt SO_PEERPIDFD: %w", opErr)
	}
	return pidfd, nil
}
