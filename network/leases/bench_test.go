package leases

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// The benchmarks compare a durable Put of one leased record with the same
// update of a map under a mutex (the in-memory path the daemon has today),
// in the same run, on tmpfs and on the disk. Each reports ops/s and the
// 99th percentile latency of one write. Run them with a fixed count, e.g.
//
//	go test -run '^$' -bench 'Write|Load|Open|Check' -benchtime 1000x ./network/leases/
//
// Write sub-benchmarks: <fs>/<writers>/<path>, path one of
//
//	mem          map + mutex (baseline)
//	store        Put: group commit (this package)
//	bolt-update  the same transaction body, one bbolt Update per write
//	bolt-batch   the same transaction body through bbolt's DB.Batch

var benchDirs = []struct{ name, dir string }{
	{"tmpfs", "/dev/shm"},
	{"disk", "/var/tmp"},
}

func benchDir(b *testing.B, parent string) string {
	b.Helper()
	if st, err := os.Stat(parent); err != nil || !st.IsDir() {
		b.Skipf("%s: %v", parent, err)
	}
	dir, err := os.MkdirTemp(parent, "leases-bench")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// slotsInUse bounds the indices written, so the file stays the size of a
// busy node's store and writes replace records as KeepAlive and Acquire do.
const slotsInUse = 5000

func BenchmarkWrite(b *testing.B) {
	for _, fs := range benchDirs {
		for _, writers := range []int{1, 8, 32} {
			for _, path := range []string{"mem", "store", "bolt-update", "bolt-batch"} {
				b.Run(fmt.Sprintf("%s/%d/%s", fs.name, writers, path), func(b *testing.B) {
					benchWrite(b, fs.dir, writers, path)
				})
			}
		}
	}
}

func benchWrite(b *testing.B, parent string, writers int, path string) {
	var (
		mu  sync.Mutex
		mem = map[int]Record{}
		s   *Store
	)
	if path != "mem" {
		var err error
		s, err = Open(filepath.Join(benchDir(b, parent), "leases.db"), Options{})
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		recs := make([]Record, slotsInUse)
		for i := range recs {
			recs[i] = leased(i+1, "bench", fmt.Sprintf("warm-%d", i+1))
		}
		if err := s.Put(context.Background(), recs...); err != nil {
			b.Fatal(err)
		}
	}
	ctx := context.Background()
	one := func(n int) error {
		r := leased(1+n%slotsInUse, "bench", fmt.Sprintf("req-%d", n))
		switch path {
		case "mem":
			if err := r.validate(); err != nil {
				return err
			}
			mu.Lock()
			mem[r.Index] = r
			mu.Unlock()
			return nil
		case "store":
			return s.Put(ctx, r)
		}
		apply, err := putTx([]Record{r})
		if err != nil {
			return err
		}
		// The same ops written straight into bbolt, as before the journal.
		inPlace := func(tx *bolt.Tx) error {
			t := &txn{tx: tx, pending: newChangeSet(), group: newChangeSet()}
			if err := apply(t); err != nil {
				return err
			}
			return t.group.applyTo(tx)
		}
		if path == "bolt-batch" {
			return s.db.Batch(inPlace)
		}
		return s.db.Update(inPlace)
	}

	var counted *Store // the store whose transactions carry the writes
	if path == "store" {
		counted = s
	}
	measure(b, counted, writers, "ops/s", one)
}

// measure runs one(n) for every n in [0, b.N) over workers goroutines and
// reports the rate (in unit) and the 99th percentile latency; with s, the
// writes each of its transactions carried.
func measure(b *testing.B, s *Store, workers int, unit string, one func(n int) error) {
	var txs0 uint64
	if s != nil {
		txs0 = s.txs.Load()
	}
	lat := make([]time.Duration, b.N)
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for w := range workers {
		wg.Go(func() {
			for n := w; n < b.N; n += workers {
				t := time.Now()
				if err := one(n); err != nil {
					b.Error(err)
					return
				}
				lat[n] = time.Since(t)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), unit)
	b.ReportMetric(float64(lat[len(lat)*99/100])/1e6, "p99-ms")
	b.ReportMetric(0, "ns/op") // the rate says it better for concurrent writers
	if s != nil {
		b.ReportMetric(float64(b.N)/float64(s.txs.Load()-txs0), "writes/tx")
	}
}

// storeOf writes n leased records to a new store in dir and closes it.
func storeOf(b *testing.B, dir string, n int) string {
	b.Helper()
	path := filepath.Join(dir, fmt.Sprintf("leases-%d.db", n))
	s, err := Open(path, Options{})
	if err != nil {
		b.Fatal(err)
	}
	recs := make([]Record, n)
	for i := range recs {
		recs[i] = leased(i+1, fmt.Sprintf("tenant-%d", i%50), fmt.Sprintf("acquire-%08d", i+1))
	}
	if err := s.Put(context.Background(), recs...); err != nil {
		b.Fatal(err)
	}
	if err := s.Close(); err != nil {
		b.Fatal(err)
	}
	return path
}

// BenchmarkLoad is the restart path's read: every record, decoded.
func BenchmarkLoad(b *testing.B) {
	for _, fs := range benchDirs {
		for _, n := range []int{5000, 10000} {
			b.Run(fmt.Sprintf("%s/%d", fs.name, n), func(b *testing.B) {
				s, err := Open(storeOf(b, benchDir(b, fs.dir), n), Options{})
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close()
				b.ResetTimer()
				for b.Loop() {
					recs, err := s.Load()
					if err != nil || len(recs) != n {
						b.Fatalf("Load: %d records, %v", len(recs), err)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/load")
			})
		}
	}
}

// BenchmarkOpen is Open of an existing store: lock, map, walk every page,
// bbolt's consistency check, schema read.
func BenchmarkOpen(b *testing.B) {
	for _, fs := range benchDirs {
		for _, n := range []int{5000, 10000} {
			b.Run(fmt.Sprintf("%s/%d", fs.name, n), func(b *testing.B) {
				path := storeOf(b, benchDir(b, fs.dir), n)
				b.ResetTimer()
				for b.Loop() {
					s, err := Open(path, Options{})
					if err != nil {
						b.Fatal(err)
					}
					s.Close()
				}
				b.ReportMetric(float64(b.Elapsed().Microseconds())/1e3/float64(b.N), "ms/open")
			})
		}
	}
}

// BenchmarkCheck isolates what verify costs inside Open: the page walk and
// bbolt's tx.Check, each on its own.
func BenchmarkCheck(b *testing.B) {
	s, err := Open(storeOf(b, benchDir(b, "/dev/shm"), 10000), Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	b.Run("walk/10000", func(b *testing.B) {
		for b.Loop() {
			if err := s.db.View(func(tx *bolt.Tx) error {
				return tx.ForEach(func(_ []byte, bk *bolt.Bucket) error { return walk(bk) })
			}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("tx.Check/10000", func(b *testing.B) {
		for b.Loop() {
			if err := s.db.View(func(tx *bolt.Tx) error {
				var first error
				for err := range tx.Check() {
					if first == nil {
						first = err
					}
				}
				return first
			}); err != nil {
				b.Fatal(err)
			}
		}
	})
}
