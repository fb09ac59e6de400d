// Command pgmin is the minimal service on phasegate: one config phase and
// the App's port (see package minimal).
package main

import (
	"context"
	"errors"
	"flag"
	"os"

	"github.com/phasegate/phasegate/app"
	"github.com/phasegate/phasegate/lifecycle"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "the address of the one port for gRPC and HTTP")
	fail := flag.Bool("fail", false, "make the config phase fail")
	flag.Parse()
	a, err := app.New(app.DefaultConfig("minimal", *listen),
		lifecycle.Phase{Name: "config", Run: func(context.Context, *lifecycle.Progress) error {
			if *fail {
				return app.BadConfig(errors.New("config: bad value"))
			}
			return nil
		}})
	if err != nil {
		os.Exit(app.ExitCode(err))
	}
	os.Exit(a.Main())
}
