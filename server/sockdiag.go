package server

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"sync"

	"golang.org/x/sys/unix"
)

// ownerFinder finds the user that owns the other end of a TCP connection
// from this host: the kernel's inet_diag (sock_diag over netlink) looks
// the peer's socket up by its four-tuple, in this network namespace, and
// reports the uid that created it. A connection from another host, or from
// another network namespace (a slot), has no socket here.
//
// It keeps one netlink socket, opened at the first lookup, and is used by
// one accept loop at a time.
type ownerFinder struct {
	mu  sync.Mutex
	fd  int // -1 until opened, -2 once closed
	seq uint32
	buf []byte
}

func newOwnerFinder() *ownerFinder { return &ownerFinder{fd: -1} }

// Layout of the kernel's structures (include/uapi/linux/inet_diag.h).
const (
	nlmsgHdrLen     = 16
	inetDiagReqLen  = 56 // struct inet_diag_req_v2
	inetDiagMsgLen  = 72 // struct inet_diag_msg
	diagMsgStateOff = 1  // inet_diag_msg.idiag_state
	diagMsgUIDOff   = 64 // inet_diag_msg.idiag_uid
	diagMsgInodeOff = 68 // inet_diag_msg.idiag_inode
	tcpEstablished  = 1
)

// errNoOwner: no full socket of this host is the other end (a remote
// peer, or one that closed already).
var errNoOwner = errors.New("no local socket is the peer")

// owner returns the uid that owns the socket whose local address is
// peerAddr and whose remote address is ours: the other end of a
// connection we accepted. Only an established, full socket counts: a
// socket its owner closed already is a time-wait stub that the kernel
// reports as uid 0.
func (f *ownerFinder) owner(peerAddr, ours netip.AddrPort) (uint32, error) {
	// A v4-mapped address on a dual-stack listener is an IPv4 client.
	pa, oa := peerAddr.Addr().Unmap(), ours.Addr().Unmap()
	if pa.Is4() != oa.Is4() {
		return 0, errNoOwner
	}
	family := byte(unix.AF_INET6)
	if pa.Is4() {
		family = unix.AF_INET
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fd == -2 {
		return 0, errors.New("sock_diag: the listener is closed")
	}
	if f.fd < 0 {
		fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
		if err != nil {
			return 0, fmt.Errorf("socket(NETLINK_SOCK_DIAG): %w", err)
		}
		f.fd, f.buf = fd, make([]byte, 4096)
	}
	f.seq++
	req := make([]byte, nlmsgHdrLen+inetDiagReqLen)
	ne := binary.NativeEndian
	ne.PutUint32(req[0:], uint32(len(req)))
	ne.PutUint16(req[4:], unix.SOCK_DIAG_BY_FAMILY)
	ne.PutUint16(req[6:], unix.NLM_F_REQUEST) // one socket, no dump
	ne.PutUint32(req[8:], f.seq)
	r := req[nlmsgHdrLen:]
	r[0], r[1] = family, unix.IPPROTO_TCP
	ne.PutUint32(r[4:], 0xffffffff) // every state: the kernel's exact lookup ignores them
	id := r[8:]                     // struct inet_diag_sockid
	binary.BigEndian.PutUint16(id[0:], peerAddr.Port())
	binary.BigEndian.PutUint16(id[2:], ours.Port())
	putAddr(id[4:20], pa)
	putAddr(id[20:36], oa)
	ne.PutUint32(id[40:], 0xffffffff) // INET_DIAG_NOCOOKIE
	ne.PutUint32(id[44:], 0xffffffff)
	if err := unix.Sendto(f.fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return 0, fmt.Errorf("sock_diag request: %w", err)
	}
	// The kernel answers an exact lookup before sendto returns.
	for {
		n, _, err := unix.Recvfrom(f.fd, f.buf, unix.MSG_DONTWAIT)
		if err != nil {
			return 0, fmt.Errorf("sock_diag answer: %w", err)
		}
		uid, done, err := parseDiagAnswer(f.buf[:n], f.seq)
		if done {
			return uid, err
		}
	}
}

// parseDiagAnswer reads the netlink messages in b answering request seq:
// the socket's uid, or an error; done is false when b held nothing of
// seq's (a stale answer).
func parseDiagAnswer(b []byte, seq uint32) (uid uint32, done bool, err error) {
	ne := binary.NativeEndian
	for len(b) >= nlmsgHdrLen {
		l := int(ne.Uint32(b[0:]))
		if l < nlmsgHdrLen || l > len(b) {
			return 0, true, errors.New("sock_diag answer: truncated message")
		}
		typ, mseq, body := ne.Uint16(b[4:]), ne.Uint32(b[8:]), b[nlmsgHdrLen:l]
		b = b[(l+3)&^3:]
		if mseq != seq {
			continue
		}
		switch {
		case typ == unix.NLMSG_ERROR && len(body) >= 4:
			errno := -int32(ne.Uint32(body))
			if errno == int32(unix.ENOENT) {
				return 0, true, errNoOwner
			}
			return 0, true, fmt.Errorf("sock_diag: %w", unix.Errno(errno))
		case typ == unix.SOCK_DIAG_BY_FAMILY && len(body) >= inetDiagMsgLen:
			if body[diagMsgStateOff] != tcpEstablished || ne.Uint32(body[diagMsgInodeOff:]) == 0 {
				return 0, true, errNoOwner
			}
			return ne.Uint32(body[diagMsgUIDOff:]), true, nil
		}
		return 0, true, fmt.Errorf("sock_diag answer: message type %d of %d bytes", typ, len(body))
	}
	return 0, false, nil
}

// putAddr writes a as the kernel's __be32[4]: an IPv4 address in the
// first word.
func putAddr(dst []byte, a netip.Addr) {
	if a.Is4() {
		b := a.As4()
		copy(dst, b[:])
		return
	}
	b := a.As16()
	copy(dst, b[:])
}

// close closes the netlink socket, if it was opened; later lookups fail.
func (f *ownerFinder) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fd >= 0 {
		_ = unix.Close(f.fd)
	}
	f.fd = -2
}
