package server_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testpb "google.golang.org/grpc/interop/grpc_testing"

	"github.com/phasegate/phasegate/server"
)

// credEcho answers EmptyCall after recording the caller's credentials.
type credEcho struct {
	testpb.UnimplementedTestServiceServer
	got chan server.PeerCred
}

func (e *credEcho) EmptyCall(ctx context.Context, _ *testpb.Empty) (*testpb.Empty, error) {
	pc, ok := server.PeerCredFromContext(ctx)
	if !ok {
		return nil, fmt.Errorf("no peer credentials")
	}
	e.got <- pc
	return &testpb.Empty{}, nil
}

// A server on a Unix socket hands gRPC services and HTTP handlers the
// caller's credentials as the kernel recorded them.
func TestUnixSocketPeerCredentials(t *testing.T) {
	path := filepath.Join(t.TempDir(), "control.sock")
	lis, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{Listener: lis, DisableReflection: true, StopTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Declare(&testpb.TestService_ServiceDesc); err != nil {
		t.Fatal(err)
	}
	httpCred := make(chan server.PeerCred, 1)
	if err := srv.Handle("GET /who", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		pc, ok := server.PeerCredFromContext(r.Context())
		if !ok {
			http.Error(w, "no peer credentials", http.StatusUnauthorized)
			return
		}
		httpCred <- pc
		_, _ = io.WriteString(w, pc.String())
	})); err != nil {
		t.Fatal(err)
	}
	echo := &credEcho{got: make(chan server.PeerCred, 1)}
	if err := srv.Bind("grpc.testing.TestService", echo); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := srv.Serve(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Drain(context.Background()) })

	want := server.PeerCred{UID: uint32(os.Getuid()), GID: uint32(os.Getgid()), PID: int32(os.Getpid())}
	check := func(what string, got server.PeerCred) {
		t.Helper()
		if got.UID != want.UID || got.GID != want.GID || got.PID != want.PID {
			t.Errorf("%s: peer %v, want %v", what, got, want)
		}
		groups, _ := os.Getgroups()
		for _, g := range groups {
			if !got.InGroup(uint32(g)) {
				t.Errorf("%s: peer groups %v lack %d (this process's groups: %v)", what, got.Groups, g, groups)
			}
		}
	}

	cc, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	if _, err := testpb.NewTestServiceClient(cc).EmptyCall(ctx, &testpb.Empty{}); err != nil {
		t.Fatalf("EmptyCall over the Unix socket: %v", err)
	}
	check("gRPC", <-echo.got)

	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", path)
	}}}
	defer hc.CloseIdleConnections()
	resp, err := hc.Get("http://control/who")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /who: %s %s", resp.Status, body)
	}
	check("HTTP", <-httpCred)
}

func TestPeerCredInGroup(t *testing.T) {
	pc := server.PeerCred{UID: 1000, GID: 100, Groups: []uint32{27, 998}}
	for _, tc := range []struct {
		gid  uint32
		want bool
	}{{100, true}, {27, true}, {998, true}, {0, false}, {1000, false}} {
		if got := pc.InGroup(tc.gid); got != tc.want {
			t.Errorf("InGroup(%d) = %v, want %v", tc.gid, got, tc.want)
		}
	}
	if s := pc.String(); !slices.Contains([]string{"uid=1000 gid=100 pid=0"}, s) {
		t.Errorf("String() = %q", s)
	}
}
