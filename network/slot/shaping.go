package slot

import "github.com/phasegate/phasegate/network/shape"

// ShapeLink is where slot s's bandwidth limits live (package
// network/shape): its host end, which a microVM's guest and a CNI
// attachment send and receive through too, and its ifb. The caller holds
// s, as for ApplyEgress; a teardown deletes the ifb where a survey found
// it or the slot's Extra says it is (HasShaper).
func (m *Manager) ShapeLink(s *Slot) shape.Link {
	return shape.Link{Host: s.HostIf, Ifb: m.cfg.ShaperIfName(s.Index)}
}
