package server_test

import (
	"strings"
	"testing"
	"time"

	"github.com/phasegate/phasegate/server"
)

// A negative duration means nothing: New says which field, instead of
// reading it as "no delay" or "the default".
func TestConfigRejectsNegativeDurations(t *testing.T) {
	for _, tt := range []struct {
		field string
		set   func(*server.Config)
	}{
		{"SniffTimeout", func(c *server.Config) { c.SniffTimeout = -time.Second }},
		{"ReadHeaderTimeout", func(c *server.Config) { c.ReadHeaderTimeout = -time.Second }},
		{"ReadTimeout", func(c *server.Config) { c.ReadTimeout = -time.Second }},
		{"WriteTimeout", func(c *server.Config) { c.WriteTimeout = -time.Second }},
		{"IdleTimeout", func(c *server.Config) { c.IdleTimeout = -time.Second }},
		{"DrainDelay", func(c *server.Config) { c.DrainDelay = -1 }},
		{"StopTimeout", func(c *server.Config) { c.StopTimeout = -time.Second }},
	} {
		t.Run(tt.field, func(t *testing.T) {
			cfg := server.DefaultConfig()
			cfg.Addr = "127.0.0.1:0"
			tt.set(&cfg)
			_, err := server.New(cfg)
			if err == nil || !strings.Contains(err.Error(), tt.field) {
				t.Errorf("New with a negative %s: %v, want an error naming the field", tt.field, err)
			}
		})
	}
}

// DefaultConfig carries the recommended bounds that a zero once stood for;
// a zero in a field now means no bound.
func TestDefaultConfig(t *testing.T) {
	got := server.DefaultConfig()
	want := server.Config{
		SniffTimeout:      5 * time.Second,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      60 * time.Second,
		IdleTimeout:       2 * time.Minute,
		DrainDelay:        5 * time.Second,
		StopTimeout:       10 * time.Second,
	}
	if got.SniffTimeout != want.SniffTimeout || got.ReadHeaderTimeout != want.ReadHeaderTimeout ||
		got.ReadTimeout != want.ReadTimeout || got.WriteTimeout != want.WriteTimeout ||
		got.IdleTimeout != want.IdleTimeout || got.DrainDelay != want.DrainDelay || got.StopTimeout != want.StopTimeout {
		t.Errorf("DefaultConfig() = %+v", got)
	}
}
