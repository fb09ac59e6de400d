package phases

import (
	"fmt"
	"math"
	"strings"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
	"github.com/phasegate/phasegate/internal/names"
	"github.com/phasegate/phasegate/network/egress"
	"github.com/phasegate/phasegate/network/leases"
	"github.com/phasegate/phasegate/network/pool"
	"github.com/phasegate/phasegate/phases/lease"
	"github.com/phasegate/phasegate/server"
)

// The daemon shares its open files (the soft RLIMIT_NOFILE, which the Go
// runtime raises to one below the hard limit at start) between its own
// work and the connections of its two servers. The reserve is what its
// own work can hold at once, computed from the configuration; the control
// socket's connections are bounded and part of it; the port may hold the
// rest. So a flood of the port never takes a descriptor the control
// socket, the records or the kernel work need (docs/DESIGN.md §10,
// "Bounds").
const (
	// fdsAtRest covers what the daemon holds for its life: standard
	// streams, the runtime's poller, the two lock files, the records and
	// their journal, the listeners and their handover copies, the cgroup
	// files the runtime reads, the netlink sockets kept open, exporters'
	// connections and both ends of the self-probe: several times what was
	// measured at rest without exporters (docs/BENCHMARKS.md, "Figures
	// behind the network code").
	fdsAtRest = 64
	// fdsPerKernelOp is what one slot's creation or teardown holds at
	// once: the namespace's file and descriptor, a netlink socket, a
	// sysctl file.
	fdsPerKernelOp = 4
	// acquireCreations are the slots made in Acquire's callers at once,
	// when the pool is empty, counted like the fill's creations. The
	// kernel serialises them, so many Acquires at once on an empty pool
	// hold few descriptors beyond those at rest (docs/BENCHMARKS.md,
	// "Figures behind the network code").
	acquireCreations = 16
	// fdsMargin is for what the measurement did not see: a burst of
	// short-lived files, a log sink.
	fdsMargin = 64
	// minPortConns is the least the port must be able to hold: fewer, and
	// the start is refused (the limit is too low for the configuration).
	minPortConns = 32
)

// The control socket's bounds: the node's orchestrator and the operator
// need a few connections each; root keeps a share no tenant can take. A
// uid the policy grants nothing is closed at accept (control.Guard.Admit),
// and what root's share leaves is the permitted principals': were any
// other peer admitted, it could take none of it.
const (
	controlMaxConns        = 128
	controlPrivilegedConns = 32
	controlPermittedConns  = controlMaxConns - controlPrivilegedConns
	controlConnsPerPeer    = 16
)

// The port's bounds besides its total: it serves checkers, scrapers and,
// with mutual TLS, orchestrators, none of which needs many calls at once
// on one connection.
const (
	// portMaxStreams bounds what one peer's calls stalled halfway through
	// their message hold: 64 connections × 32 calls × portMaxRecvMsg is
	// 32 MiB.
	portMaxStreams = 32
	// portMaxRecvMsg is what the port reads of a gRPC message without
	// mutual TLS: health's and reflection's requests, and a Slots call,
	// which is refused Unauthenticated there, up to this size and with
	// ResourceExhausted beyond it, before its body is read.
	portMaxRecvMsg = 16 << 10
	// portWindow fixes the port's flow-control windows at HTTP/2's
	// initial 64 KiB: a call refused unread stops its client after that
	// much (with grpc-go's growing windows, after megabytes), and the
	// largest Slots request takes three round trips on it.
	portWindow = 64 << 10
)

// Descriptors returns how the daemon shares its descriptors: computed
// once, in New, from the configuration and the open files limit.
func (d *Daemon) Descriptors() FDBudget { return d.fds }

// FDBudget is how the daemon shares its descriptors.
type FDBudget struct {
	Soft, Hard uint64 // RLIMIT_NOFILE as the daemon runs with it
	// Reserve is what the daemon's own work and the control socket's
	// connections may hold at once.
	Reserve int
	// Port and Control are the two servers' limits: Port.MaxConns is
	// what the reserve leaves, at most server.DefaultMaxConns.
	Port, Control server.Limits
}

// readFDBudget computes the budget from the process's RLIMIT_NOFILE.
func (c Config) readFDBudget() (FDBudget, error) {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		return FDBudget{}, fmt.Errorf("getrlimit(RLIMIT_NOFILE): %w", err)
	}
	return c.fdBudget(rl.Cur, rl.Max)
}

// fdBudget computes the budget for a soft limit of soft open files.
func (c Config) fdBudget(soft, hard uint64) (FDBudget, error) {
	kernelOps := pool.DefaultFillConcurrency + c.ReclaimWorkers + lease.VerifyWorkers + acquireCreations
	ctl := server.Limits{
		MaxConns:             controlMaxConns,
		PrivilegedConns:      controlPrivilegedConns,
		PermittedConns:       controlPermittedConns,
		MaxConnsPerPeer:      controlConnsPerPeer,
		MaxRecvMsgSize:       maxSlotsRequest(),
		MaxConcurrentStreams: server.DefaultMaxConcurrentStreams,
		MaxHeaderBytes:       server.DefaultMaxHeaderBytes,
		MaxSniffBytes:        server.DefaultMaxSniffBytes,
		MaxSniffing:          min(server.DefaultMaxSniffing, controlMaxConns),
		MaxSniffingPerPeer:   min(server.DefaultMaxSniffingPerPeer, controlConnsPerPeer),
	}
	b := FDBudget{Soft: soft, Hard: hard, Control: ctl,
		Reserve: fdsAtRest + fdsPerKernelOp*kernelOps + ctl.MaxConns + fdsMargin}
	left := int64(min(soft, math.MaxInt32)) - int64(b.Reserve)
	if left < minPortConns {
		return FDBudget{}, fmt.Errorf("%w: the open files limit %d (hard %d) leaves the port %d connections after the %d the daemon keeps for itself, want at least %d: raise the limit (LimitNOFILE=, ulimit -n, prlimit --nofile)",
			ErrConfig, soft, hard, max(left, 0), b.Reserve, minPortConns)
	}
	b.Port = server.LimitsFor(int(min(left, server.DefaultMaxConns)))
	if c.PortConnsPerPeer > 0 {
		b.Port.MaxConnsPerPeer = c.PortConnsPerPeer
	}
	b.Port.MaxConcurrentStreams = portMaxStreams
	b.Port.MaxRecvMsgSize = portMaxRecvMsg
	b.Port.Window = portWindow
	if c.RequireClientCert {
		// Only calls with a verified certificate are read whole (the
		// server refuses the others first): they need what an Acquire
		// does.
		b.Port.MaxRecvMsgSize = maxSlotsRequest()
	}
	return b, nil
}

// maxSlotsRequest is the size of the largest request of the Slots API the
// daemon accepts: an Acquire whose owner and request id are names.MaxLen
// bytes, whose TTL is the longest a Duration holds, and whose egress
// policy's two lists hold egress.MaxEntries entries of the longest text an
// entry may have; or a SetEgressPolicy with such a policy, a lease id and
// the largest index. Computed, so that a change of any of those bounds
// changes it.
func maxSlotsRequest() int {
	entries := make([]string, egress.MaxEntries)
	for i := range entries {
		entries[i] = strings.Repeat("9", egress.MaxEntryLen)
	}
	pol := &phasegatev1.EgressPolicy{Allow: entries, Deny: entries, DenyAll: true, RedirectTcp: true}
	id := strings.Repeat("x", names.MaxLen)
	acquire := &phasegatev1.AcquireRequest{Owner: id, RequestId: id, EgressPolicy: pol,
		Ttl: &durationpb.Duration{Seconds: maxDurationSeconds, Nanos: 999_999_999}}
	set := &phasegatev1.SetEgressPolicyRequest{Index: math.MaxUint32, LeaseId: leases.NewLeaseID(), EgressPolicy: pol}
	return max(proto.Size(acquire), proto.Size(set))
}

// maxDurationSeconds is the largest Duration.seconds protobuf allows
// (about 10,000 years).
const maxDurationSeconds = 315_576_000_000

// attrs are the budget as the start's log line says it.
func (b FDBudget) attrs() []any {
	return []any{"open_files", b.Soft, "hard_limit", b.Hard, "reserve", b.Reserve,
		"port_conns", b.Port.MaxConns, "port_conns_per_peer", b.Port.MaxConnsPerPeer,
		"port_sniffing", b.Port.MaxSniffing, "port_sniff_bytes", b.Port.MaxSniffBytes,
		"control_conns", b.Control.MaxConns, "control_conns_per_uid", b.Control.MaxConnsPerPeer,
		"max_request_bytes", b.Control.MaxRecvMsgSize}
}
