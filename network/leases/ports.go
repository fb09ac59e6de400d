package leases

import (
	"github.com/phasegate/phasegate/network/leases/internal/recordpb"
	"github.com/phasegate/phasegate/network/ports"
)

// portsMessage is a lease's published ports as the record stores them.
func portsMessage(ms []ports.Mapping) []*recordpb.PublishedPort {
	var out []*recordpb.PublishedPort
	for _, m := range ms {
		out = append(out, &recordpb.PublishedPort{HostIp: m.HostAddr(), HostPort: uint32(m.HostPort), SlotPort: uint32(m.SlotPort),
			Protocol: string(m.Protocol)})
	}
	return out
}
