package catalogdb

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/phasegate/phasegate/examples/catalog/catalogv1"
)

// Cache is the whole catalog in memory, read-only once warmed: the service
// answers from it and never touches the store.
type Cache struct {
	products map[string]*structpb.Struct
	json     map[string][]byte
}

// Warm reads every product from the store into a new cache, calling
// loaded with how many are loaded of how many after each one. It stops
// early when ctx ends.
func Warm(ctx context.Context, s *Store, loaded func(done, total int)) (*Cache, error) {
	c := &Cache{products: map[string]*structpb.Struct{}, json: map[string][]byte{}}
	err := s.Products(func(total int, sku string, rec []byte) error {
		if err := context.Cause(ctx); err != nil {
			return err
		}
		var p map[string]any
		if err := json.Unmarshal(rec, &p); err != nil {
			return fmt.Errorf("product %s: %w", sku, err)
		}
		p["sku"] = sku
		pb, err := structpb.NewStruct(p)
		if err != nil {
			return fmt.Errorf("product %s: %w", sku, err)
		}
		out, err := json.Marshal(p)
		if err != nil {
			return err
		}
		c.products[sku], c.json[sku] = pb, out
		loaded(len(c.products), total)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("warm the cache: %w", err)
	}
	return c, nil
}

// Len is how many products the cache holds.
func (c *Cache) Len() int { return len(c.products) }

// Server serves the cache: it implements [catalogv1.CatalogServer], and
// its ServeHTTP answers GET /v1/products/{sku} with the product as JSON.
type Server struct{ c *Cache }

// NewServer returns a server of c.
func NewServer(c *Cache) *Server { return &Server{c: c} }

var _ catalogv1.CatalogServer = (*Server)(nil)

// Get returns the product with the given SKU.
func (s *Server) Get(_ context.Context, sku *wrapperspb.StringValue) (*structpb.Struct, error) {
	p, ok := s.c.products[sku.GetValue()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "no product %q", sku.GetValue())
	}
	return p, nil
}

// Count returns how many products the catalog holds.
func (s *Server) Count(context.Context, *emptypb.Empty) (*wrapperspb.Int64Value, error) {
	return wrapperspb.Int64(int64(len(s.c.products))), nil
}

// RouteProduct is the HTTP route of one product, in http.ServeMux syntax.
const RouteProduct = "GET /v1/products/{sku}"

// ServeHTTP answers RouteProduct.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p, ok := s.c.json[r.PathValue("sku")]
	if !ok {
		http.Error(w, fmt.Sprintf("no product %q", r.PathValue("sku")), http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(p)
}
