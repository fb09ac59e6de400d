package rawip

import (
	"encoding/binary"
	"net/netip"
	"testing"
)

// The checksums of a datagram are those the kernel and a receiver check:
// summing a header with its checksum gives 0xffff.
func TestUDPChecksums(t *testing.T) {
	for _, tc := range []struct {
		src, dst string
		payload  string
	}{
		{"169.254.20.3:4000", "192.0.2.2:7002", "hello"},
		{"10.0.0.1:1", "10.0.0.2:2", ""},
		{"255.255.255.255:65535", "0.0.0.1:1", "odd"},
	} {
		p := UDP(netip.MustParseAddrPort(tc.src), netip.MustParseAddrPort(tc.dst), []byte(tc.payload))
		if got := fold(sum(0, p[:20])); got != 0xffff {
			t.Errorf("%s→%s: IPv4 header sums to %#x, want 0xffff", tc.src, tc.dst, got)
		}
		var pseudo [12]byte
		copy(pseudo[0:], p[12:20])
		pseudo[9] = 17
		binary.BigEndian.PutUint16(pseudo[10:], uint16(len(p)-20))
		if got := fold(sum(sum(0, pseudo[:]), p[20:])); got != 0xffff {
			t.Errorf("%s→%s: UDP sums to %#x with its pseudo-header, want 0xffff", tc.src, tc.dst, got)
		}
		if string(p[28:]) != tc.payload {
			t.Errorf("payload %q, want %q", p[28:], tc.payload)
		}
	}
}

// An IPv6 datagram's UDP checksum is over the IPv6 pseudo-header, and its
// frame says IPv6.
func TestUDP6Checksum(t *testing.T) {
	src, dst := netip.MustParseAddrPort("[fe80::1]:7301"), netip.MustParseAddrPort("[ff02::1]:7400")
	p := UDP(src, dst, []byte("odd"))
	if p[0]>>4 != 6 || int(binary.BigEndian.Uint16(p[4:])) != len(p)-40 || p[6] != 17 {
		t.Fatalf("IPv6 header % x: want version 6, payload length %d, next header UDP", p[:8], len(p)-40)
	}
	var pseudo [40]byte
	copy(pseudo[:32], p[8:40])
	binary.BigEndian.PutUint32(pseudo[32:], uint32(len(p)-40))
	pseudo[39] = 17
	if got := fold(sum(sum(0, pseudo[:]), p[40:])); got != 0xffff {
		t.Errorf("UDP sums to %#x with its IPv6 pseudo-header, want 0xffff", got)
	}
	if f := Ethernet(nil, nil, p); binary.BigEndian.Uint16(f[12:]) != 0x86dd {
		t.Errorf("the frame's type %#x, want IPv6 (0x86dd)", binary.BigEndian.Uint16(f[12:]))
	}
	if f := Ethernet(nil, nil, UDP(netip.MustParseAddrPort("10.0.0.1:1"), netip.MustParseAddrPort("10.0.0.2:2"), nil)); binary.BigEndian.Uint16(f[12:]) != 0x0800 {
		t.Errorf("an IPv4 frame's type %#x, want 0x0800", binary.BigEndian.Uint16(f[12:]))
	}
}
