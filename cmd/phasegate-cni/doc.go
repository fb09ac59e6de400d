// Command phasegate-cni is the CNI plugin that attaches a phasegate slot to
// a container's network namespace.
//
// A container runtime (podman, containerd, Nomad, Kubernetes through its
// runtime) execs it once per call, with "type": "phasegate-cni" in a
// network's conflist. It speaks CNI 0.4.0, 1.0.0 and 1.1.0: ADD, DEL,
// CHECK, GC, STATUS and VERSION.
//
// It holds no state: each verb is one call to the daemon on its control
// socket (package api/cni/v1), which takes a warm slot and makes it a new
// pair whose inside end is created in CNI_NETNS as CNI_IFNAME, with its
// address and default route (docs/DESIGN.md §11). A call that finds the daemon down or
// starting waits for it, up to the configuration's timeout, and then
// fails naming why; STATUS answers at once.
//
// Its configuration, beside the spec's fields:
//
//	{
//	  "cniVersion": "1.1.0",
//	  "name": "pgnet",
//	  "type": "phasegate-cni",
//	  "socket": "/run/phasegate/control.sock",
//	  "timeout": "30s",
//	  "egress": {"allow": ["10.0.0.0/8"], "deny": [], "denyAll": false},
//	  "capabilities": {"egress": true, "portMappings": true, "bandwidth": true}
//	}
//
// With "portMappings" declared, the runtime's port mappings (podman's -p,
// Kubernetes' hostPort, Nomad's port blocks: hostPort, containerPort,
// protocol, hostIP) are the attachment's published ports, DNAT'd in the
// daemon's own table before ADD answers and withdrawn by DEL and GC
// (docs/DESIGN.md §5, "Published ports"). A host port another lease
// publishes, or one bound on the host, fails the ADD.
//
// ADD and CHECK open CNI_NETNS themselves, with the credentials the
// runtime runs them with and in its mount namespace, and pass the
// namespace to the daemon open: the daemon attaches only where its caller
// could enter itself (docs/SECURITY.md, "CNI"). ADD checks the key first
// as the daemon does (the CNI spec's names, the kernel's rules for the
// interface name). The configuration on stdin is read up to 1 MiB, the
// daemon's bound on a request; beyond, the plugin fails at once with the
// spec's code for an invalid configuration (7).
//
// socket and timeout are optional (these are their defaults); egress is
// the attachments' egress policy, none when absent. With the "egress"
// capability declared, a runtime that passes capability args (libcni's
// CapabilityArgs, cnitool's CAP_ARGS) gives a container its own policy as
// {"egress": {…}}, which the runtime puts in runtimeConfig and which
// replaces the network's for that attachment. With the "bandwidth"
// capability declared, the runtime's runtimeConfig.bandwidth (CNI's:
// ingressRate, ingressBurst, egressRate, egressBurst, bits per second and
// bits; the kubelet fills it from a pod's annotations) is the
// attachment's bandwidth limits, set by the ADD on its host end; JSON
// that is not those four whole numbers is refused with code 7, as are
// limits the daemon refuses. Install it as the
// reference plugins are: `make cni-plugin CNI_PATH=/opt/cni/bin`
// (docs/DEPLOYING.md, "CNI").
package main
