package ports

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrInvalid is a mapping, or a list of them, that cannot be published:
// a port outside 1–65535, an unknown protocol, a duplicate, a host
// address that is not IPv4.
var ErrInvalid = errors.New("ports: invalid mapping")

// Protocol is a mapping's transport protocol: "tcp", "udp" or "sctp".
type Protocol string

// The protocols a mapping may name.
const (
	TCP  Protocol = "tcp"
	UDP  Protocol = "udp"
	SCTP Protocol = "sctp"
)

// number is p's IP protocol number; 0 for an unknown protocol.
func (p Protocol) number() byte {
	switch p {
	case TCP:
		return unix.IPPROTO_TCP
	case UDP:
		return unix.IPPROTO_UDP
	case SCTP:
		return unix.IPPROTO_SCTP
	}
	return 0
}

// protocolOf is the Protocol of an IP protocol number.
func protocolOf(n byte) Protocol {
	for _, p := range []Protocol{TCP, UDP, SCTP} {
		if p.number() == n {
			return p
		}
	}
	return Protocol(strconv.Itoa(int(n)))
}

// Mapping is one published port: connections to HostIP:HostPort (every
// address of the host when HostIP is the zero Addr) over Protocol reach
// the slot's SlotPort.
type Mapping struct {
	HostIP   netip.Addr
	HostPort uint16
	SlotPort uint16
	Protocol Protocol
}

// String is the mapping as podman's -p spells it:
// [HOSTIP:]HOSTPORT:SLOTPORT/PROTOCOL.
func (m Mapping) String() string {
	s := fmt.Sprintf("%d:%d/%s", m.HostPort, m.SlotPort, m.Protocol)
	if m.HostIP.IsValid() {
		s = m.HostIP.String() + ":" + s
	}
	return s
}

// Make is a Mapping from the wire's values (the Slots API's and the CNI
// plugin's: ports as 32-bit numbers, "" for every host address and for
// tcp), checked as Validate checks one.
func Make(hostIP string, hostPort, slotPort uint32, protocol string) (Mapping, error) {
	m := Mapping{Protocol: Protocol(strings.ToLower(protocol))}
	if m.Protocol == "" {
		m.Protocol = TCP
	}
	if hostIP != "" {
		a, err := netip.ParseAddr(hostIP)
		if err != nil {
			return Mapping{}, fmt.Errorf("%w: host address %q: %v", ErrInvalid, hostIP, err)
		}
		m.HostIP = a
	}
	for _, p := range []struct {
		name string
		v    uint32
		to   *uint16
	}{{"host port", hostPort, &m.HostPort}, {"slot port", slotPort, &m.SlotPort}} {
		if p.v == 0 || p.v > 65535 {
			return Mapping{}, fmt.Errorf("%w: %s %d is outside 1-65535", ErrInvalid, p.name, p.v)
		}
		*p.to = uint16(p.v)
	}
	return m, m.Validate()
}

// Parse reads podman's -p spelling: [HOSTIP:]HOSTPORT:SLOTPORT[/PROTOCOL]
// (tcp when the protocol is left out).
func Parse(s string) (Mapping, error) {
	spec, proto, _ := strings.Cut(s, "/")
	i := strings.LastIndexByte(spec, ':')
	if i < 0 {
		return Mapping{}, fmt.Errorf("%w: %q: want [HOSTIP:]HOSTPORT:SLOTPORT[/PROTOCOL]", ErrInvalid, s)
	}
	hostPart, slotPart := spec[:i], spec[i+1:]
	hostIP := ""
	if j := strings.LastIndexByte(hostPart, ':'); j >= 0 {
		hostIP, hostPart = hostPart[:j], hostPart[j+1:]
	}
	var n [2]uint32
	for k, p := range []string{hostPart, slotPart} {
		v, err := strconv.ParseUint(p, 10, 32)
		if err != nil {
			return Mapping{}, fmt.Errorf("%w: %q: port %q is not a number", ErrInvalid, s, p)
		}
		n[k] = uint32(v)
	}
	return Make(hostIP, n[0], n[1], proto)
}

// Validate reports a mapping that cannot be published: a port of 0, an
// unknown protocol, a host address that is not IPv4.
func (m Mapping) Validate() error {
	switch {
	case m.Protocol.number() == 0:
		return fmt.Errorf("%w: protocol %q: want tcp, udp or sctp", ErrInvalid, m.Protocol)
	case m.HostPort == 0 || m.SlotPort == 0:
		return fmt.Errorf("%w: %s: port 0 is not a port", ErrInvalid, m)
	case m.HostIP.IsValid() && !m.HostIP.Unmap().Is4():
		return fmt.Errorf("%w: %s: the host address is not IPv4 (slots are IPv4)", ErrInvalid, m)
	}
	return nil
}

// Overlaps reports whether m and o would take the same host port: the
// same protocol and port, on the same host address or one of them on
// every address.
func (m Mapping) Overlaps(o Mapping) bool {
	return m.Protocol == o.Protocol && m.HostPort == o.HostPort &&
		(!m.HostIP.IsValid() || !o.HostIP.IsValid() || m.HostIP == o.HostIP)
}

// ValidateList checks each mapping of a request, and that no two take the
// same host port.
func ValidateList(ms []Mapping) error {
	for i, m := range ms {
		if err := m.Validate(); err != nil {
			return err
		}
		if j := slices.IndexFunc(ms[:i], m.Overlaps); j >= 0 {
			return fmt.Errorf("%w: %s and %s take the same host port", ErrInvalid, ms[j], m)
		}
	}
	return nil
}

// Entry is a published mapping and the slot address it leads to.
type Entry struct {
	Mapping
	To netip.Addr
}

// String is the entry for a message: the mapping, then "->" and the slot
// address.
func (e Entry) String() string { return e.Mapping.String() + " -> " + e.To.String() }

// Message is a mapping's message form, as the Slots API's and the record's
// generated PublishedPort read.
type Message interface {
	GetHostIp() string
	GetHostPort() uint32
	GetSlotPort() uint32
	GetProtocol() string
}

// FromMessages reads a request's or a record's mappings, checked as
// ValidateList checks them; none for none.
func FromMessages[M Message](ms []M) ([]Mapping, error) {
	var out []Mapping
	for _, msg := range ms {
		m, err := Make(msg.GetHostIp(), msg.GetHostPort(), msg.GetSlotPort(), msg.GetProtocol())
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	return out, ValidateList(out)
}

// HostAddr is the mapping's host address for a message: "" for every
// address.
func (m Mapping) HostAddr() string {
	if !m.HostIP.IsValid() {
		return ""
	}
	return m.HostIP.String()
}

// ToMessages writes ms in a message form, each made by mk from the wire's
// values (the host address "" for every one, the protocol always named).
func ToMessages[M any](ms []Mapping, mk func(hostIP string, hostPort, slotPort uint32, protocol string) M) []M {
	var out []M
	for _, m := range ms {
		out = append(out, mk(m.HostAddr(), uint32(m.HostPort), uint32(m.SlotPort), string(m.Protocol)))
	}
	return out
}
