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
// on SIGTERM, and exits 1 when its config step fails. phasegate's keeps
// DefaultConfig's 5 s drain delay and still exits in under a second (a
// fifth of it): a port that never served skips the delay.
func TestMinimalServices(t *testing.T) {
	const failBound = time.Second
	for _, w := range []struct{ name, pkg string }{
		{"phasegate", "./minimal/pgmin"},
		{"fx", "./minimal/fxmin"},
		{"run", "./minimal/runmin"},
	} {
		t.Run(w.name, func(t *testing.T) {
			bin := bins.Build(t, w.pkg)

			began := time.Now()
			failed := proc.Start(t, bin, proc.Args("-fail"))
			if code := failed.Wait(wait); code != 1 {
				t.Errorf("-fail: exit %d, want 1\n%s", code, failed.Output())
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
