package server_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"

	"github.com/phasegate/phasegate/health"
	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/server"
)

// During the drain delay, an in-flight call finishes and a new one is
// refused with Unavailable; health is already NOT_SERVING.
func TestDrainLetsInFlightCallsFinish(t *testing.T) {
	st := newStack(t, server.Config{DrainDelay: time.Hour})
	st.start(t)
	st.serve(t)
	conn := st.grpcConn(t)
	tc := testpb.NewTestServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()

	inflight := make(chan error, 1)
	go func() {
		resp, err := tc.UnaryCall(ctx, &testpb.SimpleRequest{})
		if err == nil && resp.Username != "done" {
			err = fmt.Errorf("response %v", resp)
		}
		inflight <- err
	}()
	recv(t, st.impl.entered, "the call to be in flight")

	drainCtx, cutShort := context.WithCancel(context.Background())
	defer cutShort()
	drained := make(chan error, 1)
	go func() { drained <- st.srv.Drain(drainCtx) }()

	waitUntil(t, "health to go NOT_SERVING", func() bool { return checkHealth(t, conn, "") == notServing })
	_, err := tc.EmptyCall(ctx, &testpb.Empty{})
	if status.Code(err) != codes.Unavailable || !strings.Contains(status.Convert(err).Message(), "draining") {
		t.Errorf("new call while draining: %v, want Unavailable naming the drain", err)
	}
	close(st.impl.unblock)
	if err := recv(t, inflight, "the in-flight call"); err != nil {
		t.Errorf("in-flight call: %v", err)
	}

	// The delay is an hour: a second Drain with an ended ctx (a second
	// signal) cuts it short.
	second := make(chan error, 1)
	ended, end := context.WithCancel(context.Background())
	end()
	go func() { second <- st.srv.Drain(ended) }()
	err1, err2 := recv(t, drained, "the first Drain"), recv(t, second, "the second Drain")
	if err1 == nil || !strings.Contains(err1.Error(), "cut short") || err1.Error() != err2.Error() {
		t.Errorf("Drain results %v / %v; want the same cut-short error", err1, err2)
	}
	if err := st.srv.Drain(context.Background()); err == nil || err.Error() != err1.Error() {
		t.Errorf("third Drain: %v", err)
	}
	select {
	case <-st.srv.Done():
	default:
		t.Error("Done not closed after Drain")
	}
	if err := st.srv.Err(); err != nil {
		t.Errorf("Err() = %v after a clean drain", err)
	}
	if err := st.srv.Serve(context.Background()); !errors.Is(err, server.ErrClosed) {
		t.Errorf("Serve after Drain: %v", err)
	}
}

// A connection that sends nothing, or half a preface, does not hold up the
// drain, however long the sniff timeout, and also without one. With a short
// one the silent connection's sniff is over before the drain: it used to be
// handed to the HTTP server, whose Shutdown waited for it to the end of the
// stop timeout (it takes a connection that never sent a byte for an active
// one during its first 5 s), and the half preface, a request begun and never
// finished, was waited for the same way.
func TestSilentConnectionsDoNotDelayDrain(t *testing.T) {
	for _, sniff := range []time.Duration{time.Hour, 0, 50 * time.Millisecond} {
		t.Run(fmt.Sprintf("SniffTimeout=%v", sniff), func(t *testing.T) {
			testSilentConnectionsDoNotDelayDrain(t, sniff)
		})
	}
}

func testSilentConnectionsDoNotDelayDrain(t *testing.T, sniff time.Duration) {
	st := newStack(t, server.Config{SniffTimeout: sniff, StopTimeout: 500 * time.Millisecond})
	st.start(t)
	st.serve(t)
	silent := dialRaw(t, st.addr())
	half := dialRaw(t, st.addr())
	if _, err := half.Write([]byte("PRI * HTTP/2.0\r\n")); err != nil {
		t.Fatal(err)
	}
	// An HTTP/1 keep-alive connection and a gRPC one, both idle.
	client := httpClient(t)
	if resp, err := client.Get("http://" + st.addr() + "/livez"); err != nil {
		t.Fatal(err)
	} else {
		resp.Body.Close()
	}
	_ = checkHealth(t, st.grpcConn(t), "")
	if sniff > 0 && sniff < time.Second {
		// The silent connection's sniff times out before the drain: the
		// multiplexer closes it (net/http never sees it).
		_ = silent.SetReadDeadline(time.Now().Add(wait))
		if n, err := silent.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
			t.Fatalf("a silent connection past its sniff timeout: read %d, %v; want it closed by the server", n, err)
		}
	}

	begin := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if err := st.lc.Drain(ctx); err != nil {
		t.Errorf("Drain: %v", err)
	}
	took := time.Since(begin)
	t.Logf("drain with silent connections took %v", took)
	if took > wait/2 {
		t.Errorf("drain took %v", took)
	}
	for _, c := range []net.Conn{silent, half} {
		_ = c.SetReadDeadline(time.Now().Add(wait))
		if _, err := c.Read(make([]byte, 1)); err == nil {
			t.Error("a silent connection is still open after the drain")
		}
	}
	if _, err := net.DialTimeout("tcp", st.addr(), time.Second); err == nil {
		t.Error("the port still accepts after the drain")
	}
}

// Drain before Serve releases the port and makes Serve refuse.
func TestDrainBeforeServe(t *testing.T) {
	lc, err := lifecycle.New([]lifecycle.Phase{{Name: "x", Run: func(context.Context, *lifecycle.Progress) error { return nil }}})
	if err != nil {
		t.Fatal(err)
	}
	hc := health.New(lc, health.Options{})
	defer hc.Close()
	srv, err := server.New(server.Config{Addr: "127.0.0.1:0", Health: hc})
	if err != nil {
		t.Fatal(err)
	}
	addr, err := srv.Listen(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := srv.Serve(context.Background()); !errors.Is(err, server.ErrClosed) {
		t.Errorf("Serve after Drain: %v", err)
	}
	if _, err := net.DialTimeout("tcp", addr.String(), time.Second); err == nil {
		t.Error("port still open")
	}
}

// An explicit zero drain delay is no delay: the drain of an idle server does
// not wait the 5 s that a zero once stood for. The ctx bound is a generous
// sanity bound below those 5 s; a delay still waited for would be cut short
// by it and reported.
func TestZeroDrainDelayMeansNone(t *testing.T) {
	srv, err := server.New(server.Config{Addr: "127.0.0.1:0", DrainDelay: 0, StopTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Serve(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	if err := srv.Drain(ctx); err != nil {
		t.Errorf("Drain with DrainDelay 0: %v", err)
	}
}

// A drain hurried from its start (a second signal) with nothing in flight
// has nothing to cut short, and says so: it used to report "gRPC graceful
// stop" or "gRPC handlers" not finished when a select picked the hurry over
// a graceful stop that was ending at the same moment.
func TestHurriedDrainWithNothingInFlightReportsNothing(t *testing.T) {
	for i := range 50 {
		srv, err := server.New(server.Config{Addr: "127.0.0.1:0", StopTimeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if err := srv.Serve(context.Background()); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := srv.Drain(ctx); err != nil {
			t.Fatalf("drain %d, hurried, nothing in flight: %v", i, err)
		}
	}
}
