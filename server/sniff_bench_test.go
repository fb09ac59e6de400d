package server

import (
	"bytes"
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/soheilhy/cmux"
	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// BenchmarkDecide compares, on the same bytes, the port's decision of a
// new connection's protocol (decide) with the cmux matcher it replaced
// (HTTP2MatchHeaderFieldSendSettings on content-type application/grpc):
// a real grpc-go client's first flight up to its Check's HEADERS, and an
// HTTP/1 request, which the old matcher refused at the preface's first
// byte before the HTTP matcher took it. Neither counts cmux's own
// buffering, the same on both paths.
//
//	go test -run '^$' -bench Decide -benchmem -count 5 ./server/
func BenchmarkDecide(b *testing.B) {
	matcher := cmux.HTTP2MatchHeaderFieldSendSettings("content-type", "application/grpc")
	for _, c := range []struct {
		name string
		in   []byte
		want protocol
	}{
		{"grpc", grpcFirstFlight(b), speaksGRPC},
		{"http1", []byte("GET /health HTTP/1.1\r\nHost: 127.0.0.1:5008\r\nUser-Agent: kube-probe/1.33\r\nAccept: */*\r\n\r\n"), speaksHTTP},
	} {
		b.Run(c.name+"/decide", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if p, err := decide(io.Discard, bytes.NewReader(c.in)); p != c.want {
					b.Fatalf("decide = %v, %v; want %v", p, err, c.want)
				}
			}
		})
		b.Run(c.name+"/cmux", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if matcher(io.Discard, bytes.NewReader(c.in)) != (c.want == speaksGRPC) {
					b.Fatal("cmux's matcher disagrees")
				}
			}
		})
	}
}

// grpcFirstFlight returns what a grpc-go client sends on a new connection
// up to its first call's HEADERS frame, as a server that answers its
// preface with SETTINGS reads it.
func grpcFirstFlight(tb testing.TB) []byte {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer l.Close()
	got := make(chan []byte, 1)
	go func() {
		defer close(got)
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		var buf bytes.Buffer
		r := io.TeeReader(c, &buf)
		if _, err := io.ReadFull(r, make([]byte, len(http2.ClientPreface))); err != nil {
			return
		}
		fr := http2.NewFramer(c, r)
		if fr.WriteSettings() != nil {
			return
		}
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				return
			}
			if f.Header().Type == http2.FrameHeaders {
				got <- buf.Bytes()
				return
			}
		}
	}()
	conn, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		tb.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _, _ = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}) }()
	b, ok := <-got
	if !ok {
		tb.Fatal("no HEADERS frame from the gRPC client")
	}
	return b
}
