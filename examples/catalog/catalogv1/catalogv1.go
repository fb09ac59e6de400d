// Package catalogv1 is the catalog's gRPC API, written by hand the way
// protoc-gen-go-grpc would generate it, so that the example needs no .proto
// file and no code generator: its messages are protobuf's well-known types
// (a SKU is a wrapperspb.StringValue, a product a structpb.Struct), which
// the default codec already knows.
//
// A real service would generate this package from a .proto file; what the
// phasegate server needs from it is the same either way: a
// [grpc.ServiceDesc] to declare before the port serves, and an
// implementation of [CatalogServer] to bind once the catalog is ready.
package catalogv1

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// ServiceName is the service's full name.
const ServiceName = "catalog.v1.Catalog"

// Full method names, as a client calls them.
const (
	MethodGet   = "/" + ServiceName + "/Get"
	MethodCount = "/" + ServiceName + "/Count"
)

// CatalogServer is what an implementation of the service provides.
type CatalogServer interface {
	// Get returns the product with the given SKU, or codes.NotFound.
	Get(ctx context.Context, sku *wrapperspb.StringValue) (*structpb.Struct, error)
	// Count returns how many products the catalog holds.
	Count(ctx context.Context, _ *emptypb.Empty) (*wrapperspb.Int64Value, error)
}

// ServiceDesc describes the service for grpc.Server.RegisterService and
// phasegate's server.Server.Declare.
var ServiceDesc = grpc.ServiceDesc{
	ServiceName: ServiceName,
	HandlerType: (*CatalogServer)(nil),
	Methods: []grpc.MethodDesc{
		{MethodName: "Get", Handler: unary(MethodGet, CatalogServer.Get)},
		{MethodName: "Count", Handler: unary(MethodCount, CatalogServer.Count)},
	},
	Metadata: "catalog/v1/catalog.proto",
}

// unary adapts a method of CatalogServer to a grpc.MethodDesc handler, as
// generated code does for each method.
func unary[Req, Resp any, PReq interface {
	*Req
}](method string, call func(CatalogServer, context.Context, PReq) (Resp, error)) func(any, context.Context, func(any) error, grpc.UnaryServerInterceptor) (any, error) {
	return func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
		in := PReq(new(Req))
		if err := dec(in); err != nil {
			return nil, err
		}
		if interceptor == nil {
			return call(srv.(CatalogServer), ctx, in)
		}
		info := &grpc.UnaryServerInfo{Server: srv, FullMethod: method}
		return interceptor(ctx, in, info, func(ctx context.Context, req any) (any, error) {
			return call(srv.(CatalogServer), ctx, req.(PReq))
		})
	}
}

// Client calls the service over a connection.
type Client struct{ cc grpc.ClientConnInterface }

// NewClient returns a client of the service on cc.
func NewClient(cc grpc.ClientConnInterface) *Client { return &Client{cc: cc} }

// Get returns the product with the given SKU.
func (c *Client) Get(ctx context.Context, sku string, opts ...grpc.CallOption) (*structpb.Struct, error) {
	out := new(structpb.Struct)
	if err := c.cc.Invoke(ctx, MethodGet, wrapperspb.String(sku), out, opts...); err != nil {
		return nil, err
	}
	return out, nil
}

// Count returns how many products the catalog holds.
func (c *Client) Count(ctx context.Context, opts ...grpc.CallOption) (int64, error) {
	out := new(wrapperspb.Int64Value)
	if err := c.cc.Invoke(ctx, MethodCount, new(emptypb.Empty), out, opts...); err != nil {
		return 0, err
	}
	return out.GetValue(), nil
}
