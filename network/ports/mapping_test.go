package ports_test

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/phasegate/phasegate/network/ports"
)

func TestParse(t *testing.T) {
	for _, c := range []struct {
		in   string
		want ports.Mapping
		err  bool
	}{
		{in: "8080:80", want: ports.Mapping{HostPort: 8080, SlotPort: 80, Protocol: ports.TCP}},
		{in: "8080:80/udp", want: ports.Mapping{HostPort: 8080, SlotPort: 80, Protocol: ports.UDP}},
		{in: "8080:80/SCTP", want: ports.Mapping{HostPort: 8080, SlotPort: 80, Protocol: ports.SCTP}},
		{in: "127.0.0.1:8080:80", want: ports.Mapping{HostIP: netip.MustParseAddr("127.0.0.1"), HostPort: 8080, SlotPort: 80, Protocol: ports.TCP}},
		{in: "8080", err: true},
		{in: "0:80", err: true},
		{in: "65536:80", err: true},
		{in: "8080:0", err: true},
		{in: "8080:80/icmp", err: true},
		{in: "::1:8080:80", err: true},
		{in: "host:8080:80", err: true},
		{in: "-1:80", err: true},
	} {
		t.Run(c.in, func(t *testing.T) {
			got, err := ports.Parse(c.in)
			if c.err {
				if !errors.Is(err, ports.ErrInvalid) {
					t.Fatalf("Parse(%q) = %v, %v; want ErrInvalid", c.in, got, err)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("Parse(%q) = %v, %v; want %v", c.in, got, err, c.want)
			}
			if again, err := ports.Parse(got.String()); err != nil || again != got {
				t.Fatalf("Parse(String()) = %v, %v", again, err)
			}
		})
	}
}

func TestValidateListRefusesTwoMappingsOfOneHostPort(t *testing.T) {
	a := netip.MustParseAddr("192.0.2.1")
	for _, c := range []struct {
		name string
		ms   []ports.Mapping
		ok   bool
	}{
		{"same port, tcp and udp", []ports.Mapping{{HostPort: 1, SlotPort: 1, Protocol: ports.TCP}, {HostPort: 1, SlotPort: 1, Protocol: ports.UDP}}, true},
		{"same port twice", []ports.Mapping{{HostPort: 1, SlotPort: 1, Protocol: ports.TCP}, {HostPort: 1, SlotPort: 2, Protocol: ports.TCP}}, false},
		{"one address and every address", []ports.Mapping{{HostIP: a, HostPort: 1, SlotPort: 1, Protocol: ports.TCP}, {HostPort: 1, SlotPort: 2, Protocol: ports.TCP}}, false},
		{"two addresses", []ports.Mapping{{HostIP: a, HostPort: 1, SlotPort: 1, Protocol: ports.TCP}, {HostIP: a.Next(), HostPort: 1, SlotPort: 2, Protocol: ports.TCP}}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			if err := ports.ValidateList(c.ms); (err == nil) != c.ok {
				t.Fatalf("ValidateList = %v, want ok %t", err, c.ok)
			}
		})
	}
}
