package app

import (
	"context"
	"errors"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/phasegate/phasegate/lifecycle"
)

// A start that fails or is drained before serving ends in well under a
// second with the default drain delay of 5 s: phases not yet started do
// not start, and a port that never served has no drain delay to spend.
// The 1 s bound is a fifth of the delay it proves skipped.
func TestFailingFastIsFast(t *testing.T) {
	errBadFlag := errors.New("bad flag value")
	tests := []struct {
		name string
		// config is the first phase; a is the App, to wait for its port.
		config  func(a **App) func(context.Context, *lifecycle.Progress) error
		sigterm bool // send SIGTERM once the port is bound
		wantErr error
	}{
		{
			name: "config fails at once",
			config: func(**App) func(context.Context, *lifecycle.Progress) error {
				return func(context.Context, *lifecycle.Progress) error { return lifecycle.Permanent(errBadFlag) }
			},
			wantErr: errBadFlag,
		},
		{
			name: "config fails once the port is bound",
			config: func(a **App) func(context.Context, *lifecycle.Progress) error {
				return func(ctx context.Context, _ *lifecycle.Progress) error {
					if (*a).Addr(ctx) == nil {
						return ctx.Err()
					}
					return lifecycle.Permanent(errBadFlag)
				}
			},
			wantErr: errBadFlag,
		},
		{
			name: "SIGTERM during a slow start",
			config: func(**App) func(context.Context, *lifecycle.Progress) error {
				return func(ctx context.Context, _ *lifecycle.Progress) error {
					<-ctx.Done() // a start that would last for ever
					return ctx.Err()
				}
			},
			sigterm: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			took, runErr := timeRunToItsEnd(t, tt.config, tt.sigterm)
			if tt.wantErr == nil && runErr != nil || tt.wantErr != nil && !errors.Is(runErr, tt.wantErr) {
				t.Fatalf("Run = %v, want %v", runErr, tt.wantErr)
			}
			if took >= time.Second {
				t.Fatalf("Run returned after %v, want well under a second (the default drain delay)", took)
			}
		})
	}
}

// timeRunToItsEnd runs an App with the default drain delay and the phases
// config and db after it, sends SIGTERM once its port is bound if sigterm,
// and returns how long Run took from the start (from the SIGTERM, if
// sent), and its error.
func timeRunToItsEnd(t *testing.T, config func(a **App) func(context.Context, *lifecycle.Progress) error, sigterm bool) (time.Duration, error) {
	t.Helper()
	cfg := DefaultConfig("svc", "127.0.0.1:0")
	if cfg.DrainDelay < 5*time.Second {
		t.Fatalf("default drain delay %v: the test needs 5 s to prove it skipped", cfg.DrainDelay)
	}
	var a *App
	var err error
	a, err = New(cfg,
		lifecycle.Phase{Name: "config", Run: config(&a)},
		lifecycle.Phase{Name: "db", DependsOn: []string{"config"}, Run: nop},
	)
	if err != nil {
		t.Fatal(err)
	}
	sigs := make(chan os.Signal, 1)
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- a.run(context.Background(), sigs) }()
	if sigterm {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		if a.Addr(ctx) == nil {
			t.Fatal("the port was never bound")
		}
		start = time.Now()
		sigs <- syscall.SIGTERM
	}
	var runErr error
	select {
	case runErr = <-done:
	case <-time.After(wait):
		t.Fatal("Run did not return")
	}
	return time.Since(start), runErr
}
