package leases

import (
	"github.com/phasegate/phasegate/network/leases/internal/recordpb"
	"github.com/phasegate/phasegate/network/ports"
)

// portsMessage is a lease's published ports as the record stores them.
func portsMessage(ms []ports.Mapping) []*recordpb.PublishedPort {
	return ports.ToMessages(ms, func(ip string, hp, sp uint32, p string) *recordpb.PublishedPort {
		return &recordpb.PublishedPort{HostIp: ip, HostPort: hp, SlotPort: sp, Protocol: p}
	})
}
