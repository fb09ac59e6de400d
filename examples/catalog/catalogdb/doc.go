// Package catalogdb is the catalog example's own work, what its phases do:
// load the configuration, open a bbolt store and migrate its schema one
// version per transaction, warm an in-memory cache from it, and serve that
// cache over gRPC ([catalogv1.CatalogServer]) and HTTP.
//
// None of it knows about phasegate: the phases in the catalog's main
// package call it and report its progress, and the comparisons in
// examples/compare wire the same work with uber-go/fx and oklog/run.
package catalogdb
