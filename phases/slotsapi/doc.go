// Package slotsapi serves the Slots API (phasegate.v1.Slots) over the lease core.
//
// Each call reads its caller from the control surface's guard
// (control.CallerFrom), turns the proto into a call on [lease.Service],
// and the answer back into the proto: a lease rendered as a Slot, an error
// through [Status], the one table of the core's error kinds to gRPC codes,
// which the CNI adapter and the held slots' routes read too.
package slotsapi
