// Package cniapi serves the CNI plugin's calls on the control socket over the lease core.
//
// An attachment is a lease of owner "cni/<network>" and request
// "<container id>/<ifname>" whose slot's inside end lives in the runtime's
// namespace (docs/DESIGN.md §11). The plugin's wire (api/cni/v1) becomes
// lease values directly; the caller's namespace, entered and checked here,
// is the [lease.Target] the core attaches the slot to; the core's errors
// become the CNI spec's codes through one table.
package cniapi
