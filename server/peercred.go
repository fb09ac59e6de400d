package server

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"strconv"
	"unsafe"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// PeerCred is who is on the other end of a Unix socket connection, as the
// kernel recorded it when the peer connected (SO_PEERCRED and
// SO_PEERGROUPS): not what the peer says of itself, and not what its
// process is now, so a peer that execs or hands the connection on keeps
// the identity it connected with. It is the gRPC AuthInfo of a call on a
// [Server] that listens on a Unix socket.
type PeerCred struct {
	UID, GID uint32
	PID      int32
	// Groups are the peer's supplementary groups at connect time; nil when
	// the kernel does not report them (before Linux 4.13).
	Groups []uint32
}

// AuthType implements credentials.AuthInfo.
func (PeerCred) AuthType() string { return "unix-peercred" }

// String is "uid=0 gid=0 pid=1234".
func (p PeerCred) String() string {
	return "uid=" + strconv.FormatUint(uint64(p.UID), 10) + " gid=" + strconv.FormatUint(uint64(p.GID), 10) +
		" pid=" + strconv.FormatInt(int64(p.PID), 10)
}

// InGroup reports whether gid is the peer's primary or one of its
// supplementary groups.
func (p PeerCred) InGroup(gid uint32) bool {
	if p.GID == gid {
		return true
	}
	for _, g := range p.Groups {
		if g == gid {
			return true
		}
	}
	return false
}

// soPeerGroups is SO_PEERGROUPS (Linux 4.13, include/uapi/asm-generic/
// socket.h), which golang.org/x/sys does not name.
const soPeerGroups = 59

// readPeerCred asks the kernel who connected c.
func readPeerCred(c *net.UnixConn) (PeerCred, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return PeerCred{}, fmt.Errorf("peer credentials: %w", err)
	}
	var (
		cred   PeerCred
		opErr  error
		groups []uint32
	)
	if err := rc.Control(func(fd uintptr) {
		uc, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
		if err != nil {
			opErr = fmt.Errorf("getsockopt SO_PEERCRED: %w", err)
			return
		}
		cred = PeerCred{UID: uc.Uid, GID: uc.Gid, PID: uc.Pid}
		groups = peerGroups(int(fd))
	}); err != nil {
		return PeerCred{}, fmt.Errorf("peer credentials: %w", err)
	}
	if opErr != nil {
		return PeerCred{}, opErr
	}
	cred.Groups = groups
	return cred, nil
}

// peerGroups reads SO_PEERGROUPS, growing the buffer when the kernel says
// it holds more groups (ERANGE with the size it needs). Nil when the
// kernel does not know the option.
func peerGroups(fd int) []uint32 {
	buf := make([]byte, 64*4)
	for range 4 {
		n := uint32(len(buf))
		_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, soPeerGroups,
			uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&n)), 0)
		switch errno {
		case 0:
			out := make([]uint32, 0, n/4)
			for i := uint32(0); i+4 <= n; i += 4 {
				out = append(out, binary.NativeEndian.Uint32(buf[i:]))
			}
			return out
		case unix.ERANGE:
			buf = make([]byte, max(int(n), 2*len(buf)))
		default:
			return nil
		}
	}
	return nil
}

// unixCreds is the gRPC transport security of a server on a Unix socket:
// no handshake (the socket's permissions are the first check), and the
// peer's credentials, read by the kernel when it connected, as AuthInfo.
type unixCreds struct{}

func (unixCreds) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	tc := trackedConnOf(c)
	if tc == nil || tc.peer == nil {
		return nil, nil, fmt.Errorf("server: connection from %v: no peer credentials", c.RemoteAddr())
	}
	return c, *tc.peer, nil
}

func (unixCreds) ClientHandshake(context.Context, string, net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, fmt.Errorf("server: unixCreds is server-side only")
}

func (unixCreds) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "unix-peercred"}
}

func (unixCreds) Clone() credentials.TransportCredentials { return unixCreds{} }

func (unixCreds) OverrideServerName(string) error { return nil }

// trackedConnOf finds the server's own record of an accepted connection
// under the multiplexer's and TLS's wrappers.
func trackedConnOf(c net.Conn) *trackedConn {
	tc, _ := rawConnOf(c).(*trackedConn)
	return tc
}

// PeerCredFromContext returns the Unix peer credentials of the connection
// a gRPC call or an HTTP request came on; false for a TCP connection.
func PeerCredFromContext(ctx context.Context) (PeerCred, bool) {
	if p, ok := peer.FromContext(ctx); ok {
		if pc, ok := p.AuthInfo.(PeerCred); ok {
			return pc, true
		}
	}
	if c, ok := ctx.Value(connKey{}).(net.Conn); ok {
		if tc := trackedConnOf(c); tc != nil && tc.peer != nil {
			return *tc.peer, true
		}
	}
	return PeerCred{}, false
}

// isUnix reports whether l listens on a Unix socket.
func isUnix(l net.Listener) bool {
	return l != nil && l.Addr() != nil && (l.Addr().Network() == "unix")
}
