package leases

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/emptypb"
)

// BenchmarkAcquireOverGRPC estimates the daemon's goal (Acquire with its
// durable record at ≥ 0.5× the in-memory path's throughput, p99 ≤ 5 ms over
// gRPC) before the daemon is wired: a unary gRPC method on loopback whose
// handler does what Acquire adds to the RPC — the request-index lookup and
// the record write (store), or a map update under a mutex (mem) — called by
// 16 concurrent clients over one connection, as docs/benchmarks/server.md's
// health benchmark does. The slot itself (the pool's Get) is the same on
// both paths and left out.
func BenchmarkAcquireOverGRPC(b *testing.B) {
	for _, fs := range benchDirs {
		for _, path := range []string{"mem", "store"} {
			b.Run(fs.name+"/"+path, func(b *testing.B) { benchAcquireOverGRPC(b, fs.dir, path) })
		}
	}
}

func benchAcquireOverGRPC(b *testing.B, parent, path string) {
	const clients = 16
	var (
		mu   sync.Mutex
		mem  = map[int]Record{}
		reqs = map[string]int{}
		s    *Store
		next atomic.Int64
	)
	if path == "store" {
		var err error
		if s, err = Open(filepath.Join(benchDir(b, parent), "leases.db"), Options{}); err != nil {
			b.Fatal(err)
		}
		defer s.Close()
	}
	acquire := func(ctx context.Context) error {
		n := int(next.Add(1))
		r := leased(1+n%slotsInUse, "bench", fmt.Sprintf("req-%d", n))
		if path == "mem" {
			if err := r.validate(); err != nil {
				return err
			}
			mu.Lock()
			defer mu.Unlock()
			if _, ok := reqs[r.Owner+"\x00"+r.RequestID]; ok {
				return nil
			}
			if old, ok := mem[r.Index]; ok {
				delete(reqs, old.Owner+"\x00"+old.RequestID)
			}
			mem[r.Index], reqs[r.Owner+"\x00"+r.RequestID] = r, r.Index
			return nil
		}
		if _, ok, err := s.ByRequest(r.Owner, r.RequestID); err != nil || ok {
			return err
		}
		return s.Put(ctx, r)
	}
	call := serveAcquire(b, acquire)
	if err := call(); err != nil { // connect outside the measurement
		b.Fatal(err)
	}
	measure(b, s, clients, "calls/s", func(int) error { return call() })
}

// serveAcquire serves acquire as a unary gRPC method on loopback until b
// ends, and returns a call of it over one client connection.
func serveAcquire(b *testing.B, acquire func(context.Context) error) (call func() error) {
	desc := grpc.ServiceDesc{
		ServiceName: "phasegate.bench.Leases",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{
			MethodName: "Acquire",
			Handler: func(_ any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
				if err := dec(new(emptypb.Empty)); err != nil {
					return nil, err
				}
				return new(emptypb.Empty), acquire(ctx)
			},
		}},
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	gs := grpc.NewServer()
	gs.RegisterService(&desc, struct{}{})
	go gs.Serve(lis)
	b.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close() })
	return func() error {
		return conn.Invoke(context.Background(), "/phasegate.bench.Leases/Acquire", new(emptypb.Empty), new(emptypb.Empty))
	}
}
