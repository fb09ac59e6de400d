package rawip

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"unsafe"

	"golang.org/x/sys/unix"
)

// UDP returns a datagram from src to dst carrying payload, IPv4 or IPv6
// as their addresses are (both of one family), with its checksums
// computed: the kernel sends it as it is.
func UDP(src, dst netip.AddrPort, payload []byte) []byte {
	if src.Addr().Is6() {
		return udp6(src, dst, payload)
	}
	const ipLen = 20
	b := make([]byte, ipLen+udpLen+len(payload))
	ip := b[:ipLen]
	ip[0] = 0x45 // version 4, 5 words of header
	binary.BigEndian.PutUint16(ip[2:], uint16(len(b)))
	binary.BigEndian.PutUint16(ip[4:], 0x7067) // identification
	ip[8] = 64                                 // TTL
	ip[9] = unix.IPPROTO_UDP
	s, d := src.Addr().As4(), dst.Addr().As4()
	copy(ip[12:], s[:])
	copy(ip[16:], d[:])
	binary.BigEndian.PutUint16(ip[10:], ^fold(sum(0, ip)))
	// The pseudo-header: addresses, protocol, UDP length.
	var pseudo [12]byte
	copy(pseudo[0:], s[:])
	copy(pseudo[4:], d[:])
	pseudo[9] = unix.IPPROTO_UDP
	binary.BigEndian.PutUint16(pseudo[10:], uint16(udpLen+len(payload)))
	fillUDP(b[ipLen:], src, dst, payload, pseudo[:])
	return b
}

// udpLen is the length of a UDP header.
const udpLen = 8

// udp6 is UDP for IPv6 addresses.
func udp6(src, dst netip.AddrPort, payload []byte) []byte {
	const ipLen = 40
	b := make([]byte, ipLen+udpLen+len(payload))
	ip := b[:ipLen]
	ip[0] = 0x60 // version 6
	binary.BigEndian.PutUint16(ip[4:], uint16(udpLen+len(payload)))
	ip[6] = unix.IPPROTO_UDP // next header
	ip[7] = 64               // hop limit
	s, d := src.Addr().As16(), dst.Addr().As16()
	copy(ip[8:], s[:])
	copy(ip[24:], d[:])
	// The pseudo-header: addresses, UDP length, next header.
	var pseudo [40]byte
	copy(pseudo[0:], s[:])
	copy(pseudo[16:], d[:])
	binary.BigEndian.PutUint32(pseudo[32:], uint32(udpLen+len(payload)))
	pseudo[39] = unix.IPPROTO_UDP
	fillUDP(b[ipLen:], src, dst, payload, pseudo[:])
	return b
}

// fillUDP writes the UDP header and payload into udp, its checksum over
// the IP version's pseudo-header.
func fillUDP(udp []byte, src, dst netip.AddrPort, payload, pseudo []byte) {
	binary.BigEndian.PutUint16(udp[0:], src.Port())
	binary.BigEndian.PutUint16(udp[2:], dst.Port())
	binary.BigEndian.PutUint16(udp[4:], uint16(udpLen+len(payload)))
	copy(udp[udpLen:], payload)
	c := ^fold(sum(sum(0, pseudo), udp))
	if c == 0 {
		c = 0xffff // 0 means "no checksum" in UDP
	}
	binary.BigEndian.PutUint16(udp[6:], c)
}

// sum adds b to an Internet checksum's running one's-complement sum.
func sum(acc uint32, b []byte) uint32 {
	for i := 0; i+1 < len(b); i += 2 {
		acc += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		acc += uint32(b[len(b)-1]) << 8
	}
	return acc
}

// fold turns a running sum into its 16-bit one's-complement sum.
func fold(acc uint32) uint16 {
	for acc > 0xffff {
		acc = acc>>16 + acc&0xffff
	}
	return uint16(acc)
}

// Ethernet returns packet (an IPv4 or IPv6 packet, as its first byte
// says) in an Ethernet frame from src to dst.
func Ethernet(src, dst net.HardwareAddr, packet []byte) []byte {
	f := make([]byte, 14+len(packet))
	copy(f[0:6], dst)
	copy(f[6:12], src)
	ethType := uint16(unix.ETH_P_IP)
	if len(packet) > 0 && packet[0]>>4 == 6 {
		ethType = unix.ETH_P_IPV6
	}
	binary.BigEndian.PutUint16(f[12:], ethType)
	copy(f[14:], packet)
	return f
}

// ARPRequest returns an Ethernet frame, broadcast, that asks who has
// target on behalf of sender at MAC from: what makes the asked host learn
// that sender is at from.
func ARPRequest(from net.HardwareAddr, sender, target netip.Addr) []byte {
	f := make([]byte, 14+28)
	copy(f[0:6], net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	copy(f[6:12], from)
	binary.BigEndian.PutUint16(f[12:], unix.ETH_P_ARP)
	a := f[14:]
	binary.BigEndian.PutUint16(a[0:], 1) // Ethernet
	binary.BigEndian.PutUint16(a[2:], unix.ETH_P_IP)
	a[4], a[5] = 6, 4
	binary.BigEndian.PutUint16(a[6:], 1) // request
	copy(a[8:14], from)
	s, t := sender.As4(), target.As4()
	copy(a[14:18], s[:])
	copy(a[24:28], t[:])
	return f
}

// SendFrame sends a whole Ethernet frame out of the link called ifname in
// the calling thread's network namespace (AF_PACKET). It needs
// CAP_NET_RAW there.
func SendFrame(ifname string, frame []byte) error {
	ifc, err := net.InterfaceByName(ifname)
	if err != nil {
		return fmt.Errorf("rawip: %w", err)
	}
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("rawip: socket(AF_PACKET, SOCK_RAW): %w", err)
	}
	defer unix.Close(fd)
	to := &unix.SockaddrLinklayer{Ifindex: ifc.Index, Halen: 6}
	copy(to.Addr[:], frame[0:6])
	if err := unix.Sendto(fd, frame, 0, to); err != nil {
		return fmt.Errorf("rawip: sendto %s: %w", ifname, err)
	}
	return nil
}

// Send sends packet, a whole IPv4 packet with its header, on a raw socket
// in the calling thread's network namespace: the kernel takes the header
// as given (IPPROTO_RAW implies IP_HDRINCL), source address included. It
// needs CAP_NET_RAW in the namespace.
func Send(packet []byte) error {
	if len(packet) < 20 {
		return fmt.Errorf("rawip: a packet of %d bytes has no IPv4 header", len(packet))
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
	if err != nil {
		return fmt.Errorf("rawip: socket(AF_INET, SOCK_RAW, IPPROTO_RAW): %w", err)
	}
	defer unix.Close(fd)
	to := &unix.SockaddrInet4{Addr: [4]byte(packet[16:20])}
	if err := unix.Sendto(fd, packet, 0, to); err != nil {
		return fmt.Errorf("rawip: sendto %s: %w", netip.AddrFrom4(to.Addr), err)
	}
	return nil
}

// Tap is a descriptor attached to a tap device: what a VM monitor holds.
type Tap struct{ fd int }

// OpenTap attaches to the existing tap called name in the calling thread's
// network namespace (a persistent tap's owner may attach; root may attach
// to any). Frames written are frames the guest sends.
func OpenTap(name string) (*Tap, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("rawip: open /dev/net/tun: %w", err)
	}
	var req [unix.IFNAMSIZ + 64]byte
	copy(req[:unix.IFNAMSIZ-1], name)
	*(*uint16)(unsafe.Pointer(&req[unix.IFNAMSIZ])) = unix.IFF_TAP | unix.IFF_NO_PI
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TUNSETIFF, uintptr(unsafe.Pointer(&req[0]))); errno != 0 {
		unix.Close(fd)
		return nil, fmt.Errorf("rawip: TUNSETIFF %s: %w", name, errno)
	}
	return &Tap{fd: fd}, nil
}

// Write sends one frame as the guest.
func (t *Tap) Write(frame []byte) error {
	if _, err := unix.Write(t.fd, frame); err != nil {
		return fmt.Errorf("rawip: write to tap: %w", err)
	}
	return nil
}

// Close detaches from the tap.
func (t *Tap) Close() error { return unix.Close(t.fd) }
