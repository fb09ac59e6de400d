package phasegatev1

import "path"

// SlotsMutatingMethods returns the names of the Slots calls that change
// something (a lease, its policy or its limits), as a guard audits them; the others
// only read. Each name is a generated constant's, so that a renamed call
// cannot be left out.
func SlotsMutatingMethods() []string {
	full := []string{
		Slots_Acquire_FullMethodName,
		Slots_Release_FullMethodName,
		Slots_KeepAlive_FullMethodName,
		Slots_SetEgressPolicy_FullMethodName,
		Slots_SetPorts_FullMethodName,
		Slots_SetBandwidth_FullMethodName,
	}
	out := make([]string, len(full))
	for i, f := range full {
		out[i] = path.Base(f)
	}
	return out
}
