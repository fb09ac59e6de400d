package phases

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
	"github.com/phasegate/phasegate/internal/names"
	"github.com/phasegate/phasegate/network/egress"
	"github.com/phasegate/phasegate/phases/lease"
	"github.com/phasegate/phasegate/server"
)

// The port gets what the reserve leaves of the open files, at most
// server.DefaultMaxConns, and a limit too low for the daemon's own work is
// a configuration error; the reserve grows with the reclaim's workers.
func TestFDBudget(t *testing.T) {
	def := DefaultConfig()
	reserve := fdsAtRest + fdsPerKernelOp*(2+def.ReclaimWorkers+lease.VerifyWorkers+acquireCreations) + controlMaxConns + fdsMargin
	for _, tc := range []struct {
		name      string
		soft      uint64
		edit      func(*Config)
		portConns int
		perPeer   int
		reserve   int
		err       bool
	}{
		{"prlimit --nofile=1024", 1024, nil, 1024 - reserve, server.DefaultMaxConnsPerPeer, reserve, false},
		{"a large limit", 1 << 20, nil, server.DefaultMaxConns, server.DefaultMaxConnsPerPeer, reserve, false},
		{"too low for the daemon's own work", uint64(reserve + minPortConns - 1), nil, 0, 0, 0, true},
		{"just enough", uint64(reserve + minPortConns), nil, minPortConns, minPortConns / 4, reserve, false},
		{"more reclaim workers", 1024, func(c *Config) { c.ReclaimWorkers = 64 }, 1024 - reserve - 48*fdsPerKernelOp,
			server.DefaultMaxConnsPerPeer, reserve + 48*fdsPerKernelOp, false},
		{"--port-conns-per-peer", 1024, func(c *Config) { c.PortConnsPerPeer = 4096 }, 1024 - reserve, 4096, reserve, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			if tc.edit != nil {
				tc.edit(&c)
			}
			b, err := c.fdBudget(tc.soft, tc.soft)
			if tc.err {
				if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "raise the limit") {
					t.Fatalf("fdBudget(%d) = %v, want a configuration error saying to raise the limit", tc.soft, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if b.Reserve != tc.reserve || b.Port.MaxConns != tc.portConns || b.Port.MaxConnsPerPeer != tc.perPeer {
				t.Errorf("budget %+v, want reserve %d, port %d connections, %d per peer", b, tc.reserve, tc.portConns, tc.perPeer)
			}
			if uint64(b.Reserve+b.Port.MaxConns) > tc.soft {
				t.Errorf("the reserve %d and the port's %d exceed the limit %d", b.Reserve, b.Port.MaxConns, tc.soft)
			}
		})
	}
}

// Without mutual TLS the port reads small messages only; with it, what
// the Slots API needs; the control socket always what the Slots API needs.
func TestMessageBounds(t *testing.T) {
	plain, err := DefaultConfig().fdBudget(1024, 1024)
	if err != nil {
		t.Fatal(err)
	}
	mtls := DefaultConfig()
	mtls.RequireClientCert = true
	withCerts, err := mtls.fdBudget(1024, 1024)
	if err != nil {
		t.Fatal(err)
	}
	want := maxSlotsRequest()
	if plain.Port.MaxRecvMsgSize != portMaxRecvMsg || withCerts.Port.MaxRecvMsgSize != want ||
		plain.Control.MaxRecvMsgSize != want {
		t.Errorf("message bounds: port %d, port with mutual TLS %d, socket %d; want %d, %d, %d",
			plain.Port.MaxRecvMsgSize, withCerts.Port.MaxRecvMsgSize, plain.Control.MaxRecvMsgSize, portMaxRecvMsg, want, want)
	}
}

// The largest request the daemon accepts fits the bound, and the bound is
// no larger than such a request: an Acquire with the longest owner and
// request id and the longest policy the service takes (IPv6 /128s written
// in full, on a daemon with --slot-cidr6).
func TestMaxSlotsRequestIsTheLargestValidAcquire(t *testing.T) {
	entries := func(first int) []string {
		out := make([]string, egress.MaxEntries)
		for i := range out {
			out[i] = fmt.Sprintf("ffff:ffff:ffff:ffff:ffff:ffff:%04x:%04x/128", first, 0x1000+i)
		}
		return out
	}
	pol := &phasegatev1.EgressPolicy{Allow: entries(0xaaaa), Deny: entries(0xbbbb), DenyAll: true, RedirectTcp: true}
	if len(pol.Allow[0]) != egress.MaxEntryLen {
		t.Fatalf("an entry of %d bytes, want the longest, %d", len(pol.Allow[0]), egress.MaxEntryLen)
	}
	if _, err := lease.ParseEgress(pol, egress.Defaults{ProxyPort: 8080, IPv6: true}); err != nil {
		t.Fatalf("the largest policy is refused: %v", err)
	}
	id := strings.Repeat("x", names.MaxLen)
	if err := lease.CheckNames(id, id); err != nil {
		t.Fatal(err)
	}
	req := &phasegatev1.AcquireRequest{Owner: id, RequestId: id, EgressPolicy: pol,
		Ttl: &durationpb.Duration{Seconds: maxDurationSeconds, Nanos: 999_999_999}}
	size, bound := proto.Size(req), maxSlotsRequest()
	if size > bound || size < bound-64 {
		t.Errorf("the largest valid Acquire is %d bytes; the bound %d must hold it, and not much more", size, bound)
	}
}
