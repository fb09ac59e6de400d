// Command pgmin is the minimal service on phasegate: one config phase and
// the App's port (see package minimal).
package main

import (
	"context"
	"errors"
	"flag"
	"os"
	"time"

	"github.com/phasegate/phasegate/app"
	"github.com/phasegate/phasegate/lifecycle"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "the address of the one port for gRPC and HTTP")
	fail := flag.Bool("fail", false, "make the config phase fail")
	slow := flag.Duration("slow", 0, "how long the config phase takes")
	flag.Parse()
	a, err := app.New(app.DefaultConfig("minimal", *listen),
		lifecycle.Phase{Name: "config", Run: func(ctx context.Context, _ *lifecycle.Progress) error {
			if *fail {
				return app.BadConfig(errors.New("config: bad value"))
			}
			select {
			case <-time.After(*slow):
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}})
	if err != nil {
		os.Exit(app.ExitCode(err))
	}
	os.Exit(a.Main())
}
