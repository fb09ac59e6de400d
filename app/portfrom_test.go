package app

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/phasegate/phasegate/lifecycle"
)

// freeAddr returns a loopback address with a port nothing listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

// A config phase is the one place that reads the port's settings: the App
// binds the address it chose and drains for the delay it chose, not
// Config's (DefaultConfig's 5 s, the bound).
func TestConfigPhaseOwnsThePort(t *testing.T) {
	want := freeAddr(t)
	const delay = 300 * time.Millisecond
	var read Port // filled by the config phase
	cfg := DefaultConfig("svc", "")
	cfg.ListenAfter = []string{"config"}
	cfg.PortFrom = func() (Port, error) { return read, nil }
	a, err := New(cfg, lifecycle.Phase{Name: "config", Run: func(context.Context, *lifecycle.Progress) error {
		read = Port{Listen: want, DrainDelay: delay} // as if parsed from flags or a file
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := a.Addr(context.Background()).String(); got != want {
		t.Errorf("bound %s, want %s, the address the config phase chose", got, want)
	}
	conn, err := net.DialTimeout("tcp", want, 5*time.Second)
	if err != nil {
		t.Fatalf("dial the address the config phase chose: %v", err)
	}
	_ = conn.Close()
	began := time.Now()
	if err := a.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(began); took < delay || took >= cfg.DrainDelay {
		t.Errorf("the drain took %v, want the config phase's %v (not Config's %v)", took, delay, cfg.DrainDelay)
	}
}

// What PortFrom gives is checked when the listen phase runs: a start
// whose config phase left the port invalid fails, with an error wrapping
// ErrConfig that says what is wrong, and binds nothing.
func TestPortFromInvalid(t *testing.T) {
	errUnreadable := errors.New("config file unreadable")
	tests := []struct {
		name string
		port Port
		err  error
		want string
	}{
		{"no address", Port{DrainDelay: time.Second}, nil, "no address to listen on"},
		{"delay over the bound", Port{Listen: "127.0.0.1:0", DrainDelay: time.Minute}, nil, "drain delay of 1m0s"},
		{"negative delay", Port{Listen: "127.0.0.1:0", DrainDelay: -time.Second}, nil, "drain delay of -1s"},
		{"PortFrom fails", Port{}, errUnreadable, errUnreadable.Error()},
		{"not host:port", Port{Listen: "nonsense"}, nil, "missing port in address"},
		{"port out of range", Port{Listen: "127.0.0.1:99999"}, nil, "invalid port"},
		{"an address the host does not have", Port{Listen: "192.0.2.1:0"}, nil, "cannot assign requested address"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.Listen, cfg.DrainDelay = "", 5*time.Second
			cfg.ListenAfter = []string{"config"}
			cfg.PortFrom = func() (Port, error) { return tc.port, tc.err }
			a, err := New(cfg, lifecycle.Phase{Name: "config", Run: nop})
			if err != nil {
				t.Fatal(err)
			}
			err = a.Start(context.Background())
			if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Start: %v, want ErrConfig saying %q", err, tc.want)
			}
			if tc.err != nil && !errors.Is(err, tc.err) {
				t.Errorf("Start: %v, want it to wrap %v", err, tc.err)
			}
			if a.srv.Addr() != nil {
				t.Errorf("bound %v after an invalid port", a.srv.Addr())
			}
			_ = a.Stop(context.Background())
		})
	}
}

// PortFrom without ListenAfter is refused by New: the listen phase would
// ask before any phase could fill the answer.
func TestPortFromNeedsListenAfter(t *testing.T) {
	cfg := testConfig()
	cfg.Listen = ""
	cfg.PortFrom = func() (Port, error) { return Port{Listen: "127.0.0.1:0"}, nil }
	_, err := New(cfg, lifecycle.Phase{Name: "config", Run: nop})
	if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "ListenAfter") {
		t.Errorf("New: %v, want ErrConfig naming ListenAfter", err)
	}
}

// The drain delay's ceiling is a field of its own: a config phase may
// choose up to MaxDrainDelay, which the stop budget counts, while
// DrainDelay stays the delay of a variant without PortFrom. MaxDrainDelay
// without PortFrom is refused: it would bound nothing.
func TestMaxDrainDelayIsTheCeiling(t *testing.T) {
	cfg := testConfig()
	cfg.Listen, cfg.DrainDelay, cfg.MaxDrainDelay, cfg.StopTimeout = "", 100*time.Millisecond, 30*time.Second, time.Second
	cfg.ListenAfter = []string{"config"}
	cfg.PortFrom = func() (Port, error) { return Port{Listen: "127.0.0.1:0", DrainDelay: 20 * time.Second}, nil }
	if got, want := cfg.StopBudget(), 32*time.Second; got != want {
		t.Errorf("StopBudget %v, want %v: the ceiling and two stop timeouts", got, want)
	}
	a, err := New(cfg, lifecycle.Phase{Name: "config", Run: nop})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(context.Background()); err != nil {
		t.Errorf("Start with a drain delay of 20s under a MaxDrainDelay of 30s: %v", err)
	}
	a.SkipDrainDelay()
	_ = a.Stop(context.Background())

	plain := testConfig()
	plain.MaxDrainDelay = 30 * time.Second
	if _, err := New(plain, lifecycle.Phase{Name: "config", Run: nop}); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "MaxDrainDelay") {
		t.Errorf("New with MaxDrainDelay and no PortFrom: %v, want ErrConfig naming MaxDrainDelay", err)
	}
}
