package slot

import (
	"encoding/binary"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// The host check reads the kernel's IPv4 address and route dumps itself
// rather than through vishvananda/netlink: with 10,000 slots they hold
// ~30,000 entries, and the library builds a Go struct (with its net.IP
// and attribute slices) for each before the check can drop its own: most
// of the check's time went there (figures: docs/BENCHMARKS.md, "Figures
// behind the network code"). Here each message is read in place from one
// reused buffer, an entry outside the range checked is dropped as soon as
// its address or destination is read, and only then is its link named
// (an ioctl; an address's fixed header, a route's RTA_OIF) to drop those
// on the configuration's own links.

// errDumpInterrupted is a dump the kernel marked inconsistent
// (NLM_F_DUMP_INTR): addresses or routes changed while it ran.
var errDumpInterrupted = errors.New("dump interrupted by a change")

// ribMsg is one message of a dump: its type, its fixed header and its
// attributes, all slices of the receive buffer, valid until the next
// message.
type ribMsg struct {
	typ   uint16
	body  []byte // the family's fixed header (ifaddrmsg, rtmsg)
	attrs []byte // the rtattrs after it
}

// attr returns the payload of the first attribute of type t, nil if none.
func (m ribMsg) attr(t uint16) []byte {
	b := m.attrs
	for len(b) >= unix.SizeofRtAttr {
		l := int(binary.NativeEndian.Uint16(b[0:2]))
		if l < unix.SizeofRtAttr || l > len(b) {
			return nil
		}
		if binary.NativeEndian.Uint16(b[2:4])&nlaTypeMask == t {
			return b[unix.SizeofRtAttr:l]
		}
		b = b[min(rtaAlign(l), len(b)):]
	}
	return nil
}

// nlaTypeMask clears an attribute type's NLA_F_NESTED and
// NLA_F_NET_BYTEORDER flags.
const nlaTypeMask = ^uint16(unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER)

func rtaAlign(l int) int { return (l + unix.RTA_ALIGNTO - 1) &^ (unix.RTA_ALIGNTO - 1) }

// ribDump sends one dump request of type req with fixed header hdr (its
// length is the message's header size, its first byte the family), and calls f
// for each message of the answer; what a message holds is only valid
// during the call. The socket asks for strict checking, so that the
// kernel dumps only the family asked for. It returns errDumpInterrupted
// (wrapped) when the kernel marks the dump inconsistent; the caller
// retries.
func ribDump(req uint16, hdr []byte, f func(ribMsg)) error {
	name := map[uint16]string{unix.RTM_GETADDR: "RTM_GETADDR", unix.RTM_GETROUTE: "RTM_GETROUTE"}[req]
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("socket(NETLINK_ROUTE): %w", err)
	}
	defer unix.Close(fd)
	// Best effort: an older kernel without it ignores the fixed header's
	// filters and dumps the family anyway.
	_ = unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_GET_STRICT_CHK, 1)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("bind(NETLINK_ROUTE): %w", err)
	}
	const seq = 1
	msg := make([]byte, unix.NLMSG_HDRLEN+len(hdr))
	binary.NativeEndian.PutUint32(msg[0:4], uint32(len(msg)))
	binary.NativeEndian.PutUint16(msg[4:6], req)
	binary.NativeEndian.PutUint16(msg[6:8], unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
	binary.NativeEndian.PutUint32(msg[8:12], seq)
	copy(msg[unix.NLMSG_HDRLEN:], hdr)
	if err := unix.Sendto(fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("send %s: %w", name, err)
	}
	// The kernel fills at most 32 KiB per read of a dump; a larger buffer
	// only lets it use the largest.
	buf := make([]byte, 64<<10)
	interrupted := false
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("receive %s: %w", name, err)
		}
		for b := buf[:n]; len(b) >= unix.NLMSG_HDRLEN; {
			l := int(binary.NativeEndian.Uint32(b[0:4]))
			if l < unix.NLMSG_HDRLEN || l > len(b) {
				return fmt.Errorf("receive %s: truncated message", name)
			}
			typ := binary.NativeEndian.Uint16(b[4:6])
			flags := binary.NativeEndian.Uint16(b[6:8])
			mseq := binary.NativeEndian.Uint32(b[8:12])
			body := b[unix.NLMSG_HDRLEN:l]
			b = b[min((l+unix.NLMSG_ALIGNTO-1)&^(unix.NLMSG_ALIGNTO-1), len(b)):]
			if mseq != seq {
				continue
			}
			if flags&unix.NLM_F_DUMP_INTR != 0 {
				interrupted = true
			}
			switch typ {
			case unix.NLMSG_DONE, unix.NLMSG_ERROR:
				if len(body) >= 4 {
					if e := int32(binary.NativeEndian.Uint32(body[0:4])); e < 0 {
						return fmt.Errorf("%s: %w", name, unix.Errno(-e))
					}
				}
				if interrupted {
					return fmt.Errorf("%s: %w", name, errDumpInterrupted)
				}
				return nil
			}
			if len(body) < len(hdr) {
				continue
			}
			f(ribMsg{typ: typ, body: body[:len(hdr)], attrs: body[min(rtaAlign(len(hdr)), len(body)):]})
		}
	}
}
