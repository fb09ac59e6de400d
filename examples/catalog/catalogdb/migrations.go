package catalogdb

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
)

// migration is one step of the schema's history. up runs inside the
// transaction that also records its version, so it is applied whole or not
// at all.
type migration struct {
	name string
	up   func(tx *bolt.Tx, cfg Config) error
}

// migrations is the schema's history, oldest first; version n is the
// first n applied. Append only: a store remembers how far it got by
// number.
var migrations = []migration{
	{"create products", createBuckets("products")},
	{"seed demo products", seed},
	{"create by_name index", createBuckets("by_name")},
	{"index products by name", index("by_name", func(p product) string { return strings.ToLower(str(p["name"])) })},
	{"price as integer cents", rewrite(func(p product) error {
		f, err := strconv.ParseFloat(str(p["price"]), 64)
		if err != nil {
			return fmt.Errorf("price %q: %w", p["price"], err)
		}
		p["price_cents"] = int64(math.Round(f * 100))
		delete(p, "price")
		return nil
	})},
	{"add currency", rewrite(func(p product) error { p["currency"] = "EUR"; return nil })},
	{"create categories", createBuckets("categories")},
	{"count products per category", countCategories},
	{"create by_category index", createBuckets("by_category")},
	{"index products by category", index("by_category", func(p product) string { return str(p["cat"]) })},
	{"add stock", rewrite(func(p product) error { p["stock"] = 0; return nil })},
	{"rename name to title", rewrite(func(p product) error { p["title"] = p["name"]; delete(p, "name"); return nil })},
	{"drop by_name index", dropBuckets("by_name")},
	{"create by_title index", createBuckets("by_title")},
	{"index products by title", index("by_title", func(p product) string { return strings.ToLower(str(p["title"])) })},
	{"trim titles", rewrite(func(p product) error { p["title"] = strings.TrimSpace(str(p["title"])); return nil })},
	{"rename cat to category", rewrite(func(p product) error { p["category"] = p["cat"]; delete(p, "cat"); return nil })},
	{"tag products with their category", rewrite(func(p product) error { p["tags"] = []any{p["category"]}; return nil })},
	{"stamp creation time", stampCreated},
	{"create stock_log", createBuckets("stock_log")},
}

// product is a record as stored: JSON whose fields the migrations add,
// rename and convert.
type product = map[string]any

func str(v any) string { s, _ := v.(string); return s }

func createBuckets(names ...string) func(*bolt.Tx, Config) error {
	return func(tx *bolt.Tx, _ Config) error {
		for _, n := range names {
			if _, err := tx.CreateBucketIfNotExists([]byte(n)); err != nil {
				return fmt.Errorf("bucket %s: %w", n, err)
			}
		}
		return nil
	}
}

func dropBuckets(names ...string) func(*bolt.Tx, Config) error {
	return func(tx *bolt.Tx, _ Config) error {
		for _, n := range names {
			if err := tx.DeleteBucket([]byte(n)); err != nil {
				return fmt.Errorf("bucket %s: %w", n, err)
			}
		}
		return nil
	}
}

var categories = []string{"tools", "garden", "kitchen", "books", "toys"}

// seed writes the demo catalog: cfg.Products products with a name, a
// decimal price and a category, in the first schema's shape.
func seed(tx *bolt.Tx, cfg Config) error {
	b := tx.Bucket(bucketProducts)
	for i := 1; i <= cfg.Products; i++ {
		rec, err := json.Marshal(product{
			"name":  fmt.Sprintf("  Product %d ", i),
			"price": fmt.Sprintf("%d.%02d", i%500, i%100),
			"cat":   categories[i%len(categories)],
		})
		if err != nil {
			return err
		}
		if err := b.Put([]byte(SKU(i)), rec); err != nil {
			return err
		}
	}
	return nil
}

// SKU is the demo catalog's i-th SKU, from 1.
func SKU(i int) string { return fmt.Sprintf("SKU-%06d", i) }

// rewrite applies fn to every product.
func rewrite(fn func(p product) error) func(*bolt.Tx, Config) error {
	return func(tx *bolt.Tx, _ Config) error {
		b := tx.Bucket(bucketProducts)
		// Collected first: bbolt's cursors do not survive writes to
		// the bucket they walk.
		var keys [][]byte
		var recs []product
		err := b.ForEach(func(k, v []byte) error {
			var p product
			if err := json.Unmarshal(v, &p); err != nil {
				return fmt.Errorf("product %s: %w", k, err)
			}
			keys, recs = append(keys, bytes.Clone(k)), append(recs, p)
			return nil
		})
		if err != nil {
			return err
		}
		for i, p := range recs {
			if err := fn(p); err != nil {
				return fmt.Errorf("product %s: %w", keys[i], err)
			}
			rec, err := json.Marshal(p)
			if err != nil {
				return err
			}
			if err := b.Put(keys[i], rec); err != nil {
				return err
			}
		}
		return nil
	}
}

// index fills the named bucket with key(product) + "\x00" + SKU → SKU.
func index(bucket string, key func(p product) string) func(*bolt.Tx, Config) error {
	return func(tx *bolt.Tx, _ Config) error {
		idx := tx.Bucket([]byte(bucket))
		return tx.Bucket(bucketProducts).ForEach(func(k, v []byte) error {
			var p product
			if err := json.Unmarshal(v, &p); err != nil {
				return fmt.Errorf("product %s: %w", k, err)
			}
			return idx.Put(append([]byte(key(p)+"\x00"), k...), k)
		})
	}
}

func countCategories(tx *bolt.Tx, _ Config) error {
	counts := map[string]uint64{}
	err := tx.Bucket(bucketProducts).ForEach(func(k, v []byte) error {
		var p product
		if err := json.Unmarshal(v, &p); err != nil {
			return fmt.Errorf("product %s: %w", k, err)
		}
		counts[str(p["cat"])]++
		return nil
	})
	if err != nil {
		return err
	}
	b := tx.Bucket([]byte("categories"))
	for c, n := range counts {
		if err := b.Put([]byte(c), strconv.AppendUint(nil, n, 10)); err != nil {
			return err
		}
	}
	return nil
}

func stampCreated(tx *bolt.Tx, cfg Config) error {
	now := time.Now().UTC().Format(time.RFC3339)
	return rewrite(func(p product) error { p["created_at"] = now; return nil })(tx, cfg)
}
