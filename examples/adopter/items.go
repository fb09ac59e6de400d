package main

import (
	"context"
	"net/http"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// The gRPC service, written by hand: one method whose messages are
// protobuf's well-known types, which the default codec knows, so no .proto
// file and no generator.
const (
	itemsService = "adopter.v1.Items"
	methodLookup = "/" + itemsService + "/Lookup"
	// routeItem is the HTTP route, gated like the service.
	routeItem = "GET /v1/items/{key}"
)

// itemsServer is the service's interface, as generated code would have it.
type itemsServer interface {
	Lookup(ctx context.Context, key *wrapperspb.StringValue) (*wrapperspb.StringValue, error)
}

var itemsDesc = grpc.ServiceDesc{
	ServiceName: itemsService,
	HandlerType: (*itemsServer)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Lookup",
		Handler: func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
			in := new(wrapperspb.StringValue)
			if err := dec(in); err != nil {
				return nil, err
			}
			if interceptor == nil {
				return srv.(itemsServer).Lookup(ctx, in)
			}
			return interceptor(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: methodLookup}, func(ctx context.Context, req any) (any, error) {
				return srv.(itemsServer).Lookup(ctx, req.(*wrapperspb.StringValue))
			})
		},
	}},
	Metadata: "adopter/v1/items.proto",
}

// items answers from the cache.
type items struct{ cache map[string]string }

// Lookup returns the item's value, or codes.NotFound.
func (it *items) Lookup(_ context.Context, key *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
	v, ok := it.cache[key.GetValue()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "no item %q", key.GetValue())
	}
	return wrapperspb.String(v), nil
}

// ServeHTTP answers GET /v1/items/{key} with the item's value.
func (it *items) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	v, ok := it.cache[r.PathValue("key")]
	if !ok {
		http.Error(w, "no item "+r.PathValue("key"), http.StatusNotFound)
		return
	}
	_, _ = w.Write([]byte(v + "\n"))
}
