package phasegatev1_test

import (
	"slices"
	"testing"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
)

// Every mutating call is a method of the service, and every method that
// is not one is a read: Get, List, Watch-like calls that change nothing.
func TestSlotsMutatingMethods(t *testing.T) {
	var methods []string
	for _, m := range phasegatev1.Slots_ServiceDesc.Methods {
		methods = append(methods, m.MethodName)
	}
	mutating := phasegatev1.SlotsMutatingMethods()
	for _, m := range mutating {
		if !slices.Contains(methods, m) {
			t.Errorf("mutating %q is not a method of %s (%v)", m, phasegatev1.Slots_ServiceDesc.ServiceName, methods)
		}
	}
	reads := []string{"Get", "List"}
	for _, m := range methods {
		if !slices.Contains(mutating, m) && !slices.Contains(reads, m) {
			t.Errorf("method %q is neither mutating nor a known read: say which it is", m)
		}
	}
}
