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
