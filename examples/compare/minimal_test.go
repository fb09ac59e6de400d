package compare

import (
	"context"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/phasegate/phasegate/phasetest/proc"
)

// The minimal services that compare/weigh measures are the same service:
// each serves grpc.health.v1 SERVING and /health 200 on its port, exits 0
// on SIGTERM, and exits non-zero when its config step fails: 2 on
// phasegate, whose config phase says it is a configuration error
// (app.BadConfig), 1 on the others, which have no such contract. phasegate's keeps
// DefaultConfig's 5 s drain delay and still exits in under a second (a
// fifth of it): a port that never served skips the delay.
func TestMinimalServices(t *testing.T) {
	const failBound = time.Second
	for _, w := range []struct {
		name, pkg string
		failExit  int
	}{
		{"phasegate", "./minimal/pgmin", 2},
		{"fx", "./minimal/fxmin", 1},
		{"run", "./minimal/runmin", 1},
	} {
		t.Run(w.name, func(t *testing.T) {
			bin := bins.Build(t, w.pkg)

			began := time.Now()
			failed := proc.Start(t, bin, proc.Args("-fail"))
			if code := failed.Wait(wait); code != w.failExit {
				t.Errorf("-fail: exit %d, want %d\n%s", code, w.failExit, failed.Output())
			}
			if took := time.Since(began); took > failBound {
				t.Errorf("-fail: exited %v after exec, want under %v", took, failBound)
			}

			addr := freePort(t)
			p := proc.Start(t, bin, proc.Args("-listen", addr))
			eventually(t, "SERVING over grpc.health.v1", func() bool { return grpcServing(addr) })
			if code, body, err := tryGet(addr, "/health"); err != nil || code != 200 {
				t.Errorf("GET /health: %d %q %v", code, body, err)
			}
			p.Signal(syscall.SIGTERM)
			if code := p.Wait(wait); code != 0 {
				t.Errorf("SIGTERM: exit %d, want 0\n%s", code, p.Output())
			}
		})
	}
}

// grpcServing reports whether addr answers grpc.health.v1 with SERVING.
func grpcServing(addr string) bool {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return false
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	return err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING
}
