package grpccalls_test

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	grpchealth "google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/reflection"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
	"github.com/phasegate/phasegate/tracing/grpccalls"
)

type slotsStub struct {
	phasegatev1.UnimplementedSlotsServer
}

func (slotsStub) List(context.Context, *phasegatev1.ListRequest) (*phasegatev1.ListResponse, error) {
	return &phasegatev1.ListResponse{}, nil
}

// Application calls get a server span that continues the caller's trace;
// health checks and reflection get none.
func TestServerOption(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer func() { _ = tp.Shutdown(context.Background()) }()

	srv := grpc.NewServer(grpccalls.ServerOption(tp, nil))
	phasegatev1.RegisterSlotsServer(srv, slotsStub{})
	healthpb.RegisterHealthServer(srv, grpchealth.NewServer())
	reflection.Register(srv)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() { _ = srv.Serve(lis) })
	defer func() { srv.Stop(); wg.Wait() }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	for range 3 {
		if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	rs, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := rs.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	if _, err := rs.Recv(); err != nil {
		t.Fatal(err)
	}
	_ = rs.CloseSend()

	const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	callCtx := metadata.AppendToOutgoingContext(ctx, "traceparent", "00-"+traceID+"-"+parentID+"-01")
	if _, err := phasegatev1.NewSlotsClient(conn).List(callCtx, &phasegatev1.ListRequest{}); err != nil {
		t.Fatal(err)
	}
	srv.GracefulStop()

	spans := rec.Ended()
	if len(spans) != 1 {
		var names []string
		for _, s := range spans {
			names = append(names, s.Name())
		}
		t.Fatalf("spans %q, want only the Slots call's", names)
	}
	s := spans[0]
	if s.Name() != "phasegate.v1.Slots/List" || s.SpanKind() != trace.SpanKindServer {
		t.Errorf("span %q kind %v", s.Name(), s.SpanKind())
	}
	if got := s.SpanContext().TraceID().String(); got != traceID {
		t.Errorf("trace %s, want the caller's %s", got, traceID)
	}
	if got := s.Parent().SpanID().String(); got != parentID || !s.Parent().IsRemote() {
		t.Errorf("parent %s (remote %v), want the caller's span %s", got, s.Parent().IsRemote(), parentID)
	}
}
