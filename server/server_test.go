package server_test

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	"github.com/phasegate/phasegate/server"
)

// Before its implementation is bound, an application call fails at once
// with Unavailable naming the phase; the same connection then works once
// the daemon serves, natively dispatched.
func TestLateBoundService(t *testing.T) {
	st := newStack(t, server.Config{})
	st.start(t)
	conn := st.grpcConn(t)
	tc := testpb.NewTestServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()

	// Warm the connection up so the figure below is the call, not the dial.
	_ = checkHealth(t, conn, "")
	begin := time.Now()
	_, err := tc.EmptyCall(ctx, &testpb.Empty{})
	took := time.Since(begin)
	t.Logf("Unavailable after %v", took)
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("EmptyCall before bind: %v, want Unavailable", err)
	}
	msg := status.Convert(err).Message()
	if !strings.Contains(msg, "phase reclaim 1200/5000 namespaces") || !strings.Contains(msg, testService) {
		t.Errorf("Unavailable message %q does not name the service, the phase and its progress", msg)
	}
	if took > time.Second { // not a hang; the benchmark has the real figure
		t.Errorf("Unavailable took %v", took)
	}
	stream, err := tc.StreamingOutputCall(ctx, &testpb.StreamingOutputCallRequest{})
	if err == nil {
		_, err = stream.Recv()
	}
	if status.Code(err) != codes.Unavailable {
		t.Errorf("streaming call before bind: %v, want Unavailable", err)
	}
	st.obs.mu.Lock()
	refused := len(st.obs.methods)
	st.obs.mu.Unlock()
	if n := refused; n != 0 {
		t.Errorf("the unary interceptor saw %d refused calls; refused calls end before it", n)
	}

	st.serve(t)
	if _, err := tc.EmptyCall(ctx, &testpb.Empty{}); err != nil {
		t.Fatalf("EmptyCall on the same connection once serving: %v", err)
	}
	stream, err = tc.StreamingOutputCall(ctx, &testpb.StreamingOutputCallRequest{})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for ; ; n++ {
		if _, err := stream.Recv(); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("stream: %v", err)
		}
	}
	if n != 3 {
		t.Errorf("stream sent %d messages, want 3", n)
	}
	// Unimplemented methods of a bound service stay Unimplemented.
	if _, err := tc.UnimplementedCall(ctx, &testpb.Empty{}); status.Code(err) != codes.Unimplemented {
		t.Errorf("UnimplementedCall: %v", err)
	}

	st.obs.mu.Lock()
	methods, servers := st.obs.methods, st.obs.servers
	st.obs.mu.Unlock()
	if len(methods) == 0 || methods[0] != "/grpc.testing.TestService/EmptyCall" || servers[0] != st.impl {
		t.Errorf("interceptor saw %q with servers %v; want EmptyCall with the bound implementation", methods, servers)
	}
	if st.obs.rpcBegun.Load() < 4 {
		t.Errorf("stats handler saw %d RPCs", st.obs.rpcBegun.Load())
	}
	info := st.srv.GetServiceInfo()
	if si, ok := info[testService]; !ok || len(si.Methods) != 8 || si.Metadata != testpb.TestService_ServiceDesc.Metadata {
		t.Errorf("GetServiceInfo()[%s] = %+v", testService, si)
	}
}

// Server reflection lists the declared services, so grpcurl works.
func TestReflection(t *testing.T) {
	st := newStack(t, server.Config{})
	st.start(t)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	stream, err := reflectionpb.NewServerReflectionClient(st.grpcConn(t)).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{
		MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{},
	}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	for _, want := range []string{testService, "grpc.health.v1.Health"} {
		if !containsString(names, want) {
			t.Errorf("reflection lists %q, missing %s", names, want)
		}
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{
		MessageRequest: &reflectionpb.ServerReflectionRequest_FileContainingSymbol{FileContainingSymbol: testService},
	}); err != nil {
		t.Fatal(err)
	}
	if resp, err := stream.Recv(); err != nil || len(resp.GetFileDescriptorResponse().GetFileDescriptorProto()) == 0 {
		t.Errorf("no file descriptor for %s: %v %v", testService, err, resp.GetErrorResponse())
	}
	_ = stream.CloseSend()
}

func containsString(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

func TestDeclareAndBindErrors(t *testing.T) {
	st := newStack(t, server.Config{})
	if err := st.srv.Declare(&testpb.TestService_ServiceDesc); err == nil {
		t.Error("declaring a service twice succeeded")
	}
	if err := st.srv.Declare(&grpc.ServiceDesc{ServiceName: "x.Y", HandlerType: 3}); err == nil {
		t.Error("a HandlerType that is not an interface pointer was accepted")
	}
	if err := st.srv.Bind("no.such.Service", st.impl); err == nil {
		t.Error("binding an undeclared service succeeded")
	}
	if err := st.srv.Bind(testService, struct{}{}); err == nil {
		t.Error("binding a value that does not implement the service succeeded")
	}
	if err := st.srv.Bind(testService, nil); err == nil {
		t.Error("binding nil succeeded")
	}
	st.start(t)
	err := st.srv.Declare(&reflectionpb.ServerReflection_ServiceDesc)
	if !errors.Is(err, server.ErrServing) {
		t.Errorf("Declare after Serve: %v, want ErrServing", err)
	}
	bare, err := server.New(server.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bare.Listen(context.Background()); !errors.Is(err, server.ErrNoAddr) {
		t.Errorf("Listen without Addr, Listener or SetPort: %v, want ErrNoAddr", err)
	}
	_ = bare.Drain(context.Background())
}

// The Binder binds through a service's generated Register function: the
// service it names is bound, and an undeclared one is an error Err keeps,
// not lost to a later success.
func TestBinderBindsThroughTheGeneratedRegister(t *testing.T) {
	st := newStack(t, server.Config{})
	b := st.srv.Binder()
	testpb.RegisterTestServiceServer(b, st.impl)
	if err := b.Err(); err != nil {
		t.Fatalf("binding the declared TestService: %v", err)
	}
	undeclared := st.srv.Binder()
	testpb.RegisterReconnectServiceServer(undeclared, testpb.UnimplementedReconnectServiceServer{})
	testpb.RegisterTestServiceServer(undeclared, st.impl)
	if err := undeclared.Err(); err == nil || !strings.Contains(err.Error(), "grpc.testing.ReconnectService") {
		t.Errorf("binding an undeclared service: %v, want an error naming it", err)
	}
}

// A listener that fails while serving closes Done and reports why.
func TestServeFailureIsReported(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{Listener: l})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Serve(context.Background()); err != nil {
		t.Fatal(err)
	}
	_ = l.Close() // from under the server
	recv(t, srv.Done(), "Done after the listener failed")
	if err := srv.Err(); err == nil || !strings.Contains(err.Error(), "stopped serving") {
		t.Errorf("Err() = %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	_ = srv.Drain(ctx)
}
