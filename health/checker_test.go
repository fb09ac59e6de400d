package health_test

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/phasegate/phasegate/health"
	"github.com/phasegate/phasegate/health/internal/healthtest"
)

const (
	serving    = healthpb.HealthCheckResponse_SERVING
	notServing = healthpb.HealthCheckResponse_NOT_SERVING
	appService = "test.v1.Slots"
)

func checkStatus(t *testing.T, cl healthpb.HealthClient, service string) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), healthtest.Wait)
	defer cancel()
	resp, err := cl.Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		t.Fatalf("Check(%q): %v", service, err)
	}
	return resp.Status
}

func wantStatus(t *testing.T, cl healthpb.HealthClient, service string, want healthpb.HealthCheckResponse_ServingStatus) {
	t.Helper()
	if got := checkStatus(t, cl, service); got != want {
		t.Errorf("Check(%q) = %v, want %v", service, got, want)
	}
}

// watcher collects a Watch stream's statuses on a channel.
func watch(t *testing.T, cl healthpb.HealthClient, service string) (<-chan healthpb.HealthCheckResponse_ServingStatus, <-chan error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := cl.Watch(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		cancel()
		t.Fatalf("Watch(%q): %v", service, err)
	}
	statuses := make(chan healthpb.HealthCheckResponse_ServingStatus, 16)
	end := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			resp, err := stream.Recv()
			if err != nil {
				end <- err
				return
			}
			statuses <- resp.Status
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return statuses, end
}

func next(t *testing.T, c <-chan healthpb.HealthCheckResponse_ServingStatus, want healthpb.HealthCheckResponse_ServingStatus) {
	t.Helper()
	if got := healthtest.Recv(t, c, "a Watch update "+want.String()); got != want {
		t.Fatalf("Watch sent %v, want %v", got, want)
	}
}

func TestCheckerFollowsLifecycle(t *testing.T) {
	r := healthtest.NewRig(t, false)
	c := health.New(r.LC, health.Options{Services: []string{appService}})
	t.Cleanup(c.Close)
	cl := grpcHealth(t, c)

	// Before Start: grpc-go's default would be SERVING.
	wantStatus(t, cl, "", notServing)
	overall, _ := watch(t, cl, "")
	next(t, overall, notServing)
	reclaim, _ := watch(t, cl, health.PhaseServicePrefix+"reclaim")
	next(t, reclaim, notServing)

	r.Start(t)
	healthtest.Eventually(t, "phase lock to be reported SERVING", func() bool {
		return checkStatus(t, cl, health.PhaseServicePrefix+"lock") == serving
	})
	wantStatus(t, cl, "", notServing)
	wantStatus(t, cl, health.PhaseServicePrefix+"reclaim", notServing)
	wantStatus(t, cl, appService, notServing)

	ctx, cancel := context.WithTimeout(context.Background(), healthtest.Wait)
	defer cancel()
	list, err := cl.List(ctx, &healthpb.HealthListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"", appService, "phasegate.phase.lock", "phasegate.phase.listen", "phasegate.phase.reclaim", "phasegate.phase.serve"} {
		if _, ok := list.Statuses[name]; !ok {
			t.Errorf("List has no %q: %v", name, list.Statuses)
		}
	}
	if n := len(list.Statuses); n != 6 {
		t.Errorf("List has %d services, want 6", n)
	}

	if err := r.Serve(t); err != nil {
		t.Fatal(err)
	}
	next(t, reclaim, serving)
	next(t, overall, serving)
	// Serving, but the application service is not bound yet.
	wantStatus(t, cl, appService, notServing)
	c.SetServiceReady(appService, true)
	wantStatus(t, cl, appService, serving)
	if ok, why := c.Ready(); !ok || why != "serving" {
		t.Errorf("Ready() = %v, %q; want true, serving", ok, why)
	}

	r.Drain(t)
	next(t, overall, notServing)
	wantStatus(t, cl, appService, notServing)
	// Phases that succeeded stay reported as such.
	wantStatus(t, cl, health.PhaseServicePrefix+"reclaim", serving)
	if ok, why := c.Ready(); ok || why != "draining" {
		t.Errorf("Ready() = %v, %q; want false, draining", ok, why)
	}
	select {
	case s := <-overall:
		t.Errorf("unexpected Watch update %v after draining", s)
	default:
	}

	_, err = cl.Check(ctx, &healthpb.HealthCheckRequest{Service: "no.such.Service"})
	if status.Code(err) != codes.NotFound {
		t.Errorf("Check of an unknown service: %v, want NotFound", err)
	}
}

func TestCheckerShutdownComesFirst(t *testing.T) {
	r := healthtest.NewRig(t, false)
	c := health.New(r.LC, health.Options{Services: []string{appService}})
	t.Cleanup(c.Close)
	cl := grpcHealth(t, c)
	r.Start(t)
	if err := r.Serve(t); err != nil {
		t.Fatal(err)
	}
	c.SetServiceReady(appService, true)
	healthtest.Eventually(t, `"" to be SERVING`, func() bool { return checkStatus(t, cl, "") == serving })

	// The lifecycle still serves; the checker says otherwise at once.
	c.Shutdown()
	wantStatus(t, cl, "", notServing)
	wantStatus(t, cl, appService, notServing)
	wantStatus(t, cl, health.PhaseServicePrefix+"serve", serving)
	if ok, why := c.Ready(); ok || why != "draining" {
		t.Errorf("Ready() = %v, %q; want false, draining", ok, why)
	}
	// Later readiness changes cannot undo it.
	c.SetServiceReady(appService, true)
	wantStatus(t, cl, appService, notServing)
}

func TestCheckerFailedStart(t *testing.T) {
	r := healthtest.NewRig(t, true)
	c := health.New(r.LC, health.Options{})
	t.Cleanup(c.Close)
	cl := grpcHealth(t, c)
	overall, _ := watch(t, cl, "")
	next(t, overall, notServing)
	r.Start(t)
	if err := r.Serve(t); err == nil {
		t.Fatal("start succeeded, want the reclaim failure")
	}
	healthtest.Eventually(t, "phase lock to be SERVING", func() bool {
		return checkStatus(t, cl, health.PhaseServicePrefix+"lock") == serving
	})
	wantStatus(t, cl, "", notServing)
	wantStatus(t, cl, health.PhaseServicePrefix+"reclaim", notServing)
	wantStatus(t, cl, health.PhaseServicePrefix+"serve", notServing)
	ok, why := c.Ready()
	if ok || why != `failed: phase "reclaim" failed after 1 attempt: netns dir unreadable` {
		t.Errorf("Ready() = %v, %q", ok, why)
	}
	select {
	case s := <-overall:
		t.Errorf("unexpected Watch update %v", s)
	default:
	}
}

func TestCheckerCloseEndsWatch(t *testing.T) {
	r := healthtest.NewRig(t, false)
	c := health.New(r.LC, health.Options{})
	cl := grpcHealth(t, c)
	overall, end := watch(t, cl, "")
	next(t, overall, notServing)

	c.Close()
	err := healthtest.Recv(t, end, "the Watch stream to end")
	if status.Code(err) != codes.Unavailable {
		t.Errorf("Watch ended with %v, want Unavailable", err)
	}
	// New Watch calls end at once; Check keeps answering.
	_, end = watch(t, cl, "")
	if err := healthtest.Recv(t, end, "a Watch after Close to end"); status.Code(err) != codes.Unavailable {
		t.Errorf("Watch after Close: %v, want Unavailable", err)
	}
	wantStatus(t, cl, "", notServing)
	c.Close() // idempotent
}

func TestCheckerServiceReadiness(t *testing.T) {
	r := healthtest.NewRig(t, false)
	c := health.New(r.LC, health.Options{})
	t.Cleanup(c.Close)
	cl := grpcHealth(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), healthtest.Wait)
	defer cancel()

	// An unknown service appears when it is first marked.
	if _, err := cl.Check(ctx, &healthpb.HealthCheckRequest{Service: appService}); status.Code(err) != codes.NotFound {
		t.Fatalf("Check before SetServiceReady: %v, want NotFound", err)
	}
	c.SetServiceReady(appService, true)
	wantStatus(t, cl, appService, notServing) // ready, but the lifecycle is not serving
	r.Start(t)
	if err := r.Serve(t); err != nil {
		t.Fatal(err)
	}
	healthtest.Eventually(t, "the service to be SERVING", func() bool { return checkStatus(t, cl, appService) == serving })
	c.SetServiceReady(appService, false)
	wantStatus(t, cl, appService, notServing)
	wantStatus(t, cl, "", serving)
}
