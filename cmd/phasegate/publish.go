package main

import (
	"strings"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
	"github.com/phasegate/phasegate/network/ports"
)

// publishFlags is --publish, repeated: a lease's published ports in
// podman's -p spelling, [HOSTIP:]HOSTPORT:SLOTPORT[/tcp|udp|sctp], checked
// as the flag is parsed.
type publishFlags []*phasegatev1.PublishedPort

func (p *publishFlags) String() string {
	if p == nil {
		return ""
	}
	var out []string
	for _, m := range *p {
		out = append(out, m.String())
	}
	return strings.Join(out, ",")
}

func (p *publishFlags) Set(s string) error {
	m, err := ports.Parse(s)
	if err != nil {
		return err
	}
	*p = append(*p, ports.ToMessages([]ports.Mapping{m}, func(ip string, hp, sp uint32, proto string) *phasegatev1.PublishedPort {
		return &phasegatev1.PublishedPort{HostIp: ip, HostPort: hp, SlotPort: sp, Protocol: proto}
	})...)
	return nil
}
