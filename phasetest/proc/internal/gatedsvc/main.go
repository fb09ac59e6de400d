// Command gatedsvc is the service package proc's tests run.
//
// It has a config phase that fails on -fail, a hold phase that waits for a
// line on its stdin (so that the test sees the port before serving), and the
// App's own listen and serve, logging in -log-format.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"

	"github.com/phasegate/phasegate/app"
	"github.com/phasegate/phasegate/lifecycle"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "the port's address")
	format := flag.String("log-format", "text", "text or json")
	fail := flag.Bool("fail", false, "fail the config phase")
	hold := flag.Bool("hold", false, "hold the start until a line on stdin")
	flag.Parse()
	cfg := app.DefaultConfig("gatedsvc", *listen)
	cfg.DrainDelay = 0
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	if *format == "json" {
		cfg.Logger = slog.New(slog.NewJSONHandler(os.Stderr, nil))
	}
	a, err := app.New(cfg,
		lifecycle.Phase{Name: "config", Run: func(context.Context, *lifecycle.Progress) error {
			if *fail {
				return lifecycle.Permanent(errors.New("config: -fail"))
			}
			return nil
		}},
		lifecycle.Phase{Name: "hold", DependsOn: []string{"config", app.PhaseListen}, Run: func(ctx context.Context, _ *lifecycle.Progress) error {
			if *hold {
				return waitLine(ctx)
			}
			return nil
		}},
	)
	if err != nil {
		fmt.Fprintln(os.Stderr, "gatedsvc:", err)
		os.Exit(2)
	}
	os.Exit(a.Main())
}

// waitLine returns once stdin gives a line, or ctx ends.
func waitLine(ctx context.Context) error {
	line := make(chan error, 1)
	go func() { // ends at the line or at stdin's end, or with the process
		_, err := bufio.NewReader(os.Stdin).ReadString('\n')
		line <- err
	}()
	select {
	case err := <-line:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}
