package control_test

import (
	"context"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/phasegate/phasegate/control"
	"github.com/phasegate/phasegate/server"
)

// A call that charges more than itself spends its caller's rate as that
// many calls would: the guard refuses what the bucket does not hold,
// spending nothing, lets a charge larger than the bucket through when it
// is full, and charges root nothing.
func TestCharge(t *testing.T) {
	p := &control.AccessPolicy{Rate: 10, Rules: []control.Rule{{UID: new(uint32(1001)), Owners: []string{"*"}}}}
	if err := p.Resolve(); err != nil {
		t.Fatal(err)
	}
	g, err := control.NewGuard(p, control.GuardOptions{Service: "t.S", Mutating: []string{"Set"}})
	if err != nil {
		t.Fatal(err)
	}
	info := &grpc.UnaryServerInfo{FullMethod: "/t.S/Set"}
	call := func(uid uint32, charge int) codes.Code {
		ctx := peer.NewContext(context.Background(), &peer.Peer{AuthInfo: server.PeerCred{UID: uid, GID: uid}})
		_, err := g.Intercept(ctx, nil, info, func(ctx context.Context, _ any) (any, error) {
			return nil, control.Charge(ctx, charge)
		})
		return status.Code(err)
	}
	// Rate 10: a bucket of 20 calls, full. Each call spends 1 before its
	// charge.
	for _, step := range []struct {
		name   string
		uid    uint32
		charge int
		want   codes.Code
	}{
		{"a call charging 15 more: 16 spent, 4 left", 1001, 15, codes.OK},
		{"another such call: its own 1 spent, the 15 refused, 3 left", 1001, 15, codes.ResourceExhausted},
		{"a call charging 1 more: 1 left", 1001, 1, codes.OK},
		{"a plain call: none left", 1001, 0, codes.OK},
		{"a plain call on an empty bucket", 1001, 0, codes.ResourceExhausted},
		{"root, charging the most", 0, 1 << 20, codes.OK},
	} {
		if got := call(step.uid, step.charge); got != step.want {
			t.Errorf("%s: %v, want %v", step.name, got, step.want)
		}
	}
	// Outside a call the guard admitted, Charge does nothing.
	if err := control.Charge(context.Background(), 1<<20); err != nil {
		t.Errorf("Charge outside a guarded call: %v", err)
	}
	// A charge larger than the bucket takes, with its call, the whole of a
	// full one.
	g2, err := control.NewGuard(p, control.GuardOptions{Service: "t.S", Mutating: []string{"Set"}})
	if err != nil {
		t.Fatal(err)
	}
	g = g2
	if got := call(1001, 1000); got != codes.OK {
		t.Errorf("a charge over the bucket's size on a full bucket: %v, want OK", got)
	}
	if got := call(1001, 0); got != codes.ResourceExhausted {
		t.Errorf("a call right after a charge the size of the bucket: %v, want ResourceExhausted", got)
	}
}
