package catalogdb

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
)

// Config is the catalog's configuration file, JSON:
//
//	{"db": "/var/lib/catalog/catalog.db", "products": 1000}
type Config struct {
	// DB is the bbolt file. Required.
	DB string `json:"db"`
	// Products is how many demo products the migration writes
	// into a new store; zero writes none.
	Products int `json:"products"`
}

// DefaultConfig is the configuration used without a file.
func DefaultConfig() Config { return Config{DB: "catalog.db", Products: 1000} }

// LoadConfig reads the configuration at path over the defaults; an empty
// path means the defaults. Unknown fields are errors: a typo must not
// silently leave a setting at its default.
func LoadConfig(path string) (Config, error) {
	c := DefaultConfig()
	if path != "" {
		f, err := os.Open(path)
		if err != nil {
			return Config{}, fmt.Errorf("config: %w", err)
		}
		defer f.Close()
		dec := json.NewDecoder(f)
		dec.DisallowUnknownFields()
		if err := dec.Decode(&c); err != nil {
			return Config{}, fmt.Errorf("config %s: %w", path, err)
		}
	}
	var errs []error
	if c.DB == "" {
		errs = append(errs, errors.New("db is required"))
	}
	if c.Products < 0 || c.Products > 1_000_000 {
		errs = append(errs, fmt.Errorf("products is %d, must be in [0, 1000000]", c.Products))
	}
	if err := errors.Join(errs...); err != nil {
		return Config{}, fmt.Errorf("config %s: %w", path, err)
	}
	return c, nil
}
