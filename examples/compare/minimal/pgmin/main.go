package main

import (
	"context"
	"os"

	"github.com/phasegate/phasegate/app"
	"github.com/phasegate/phasegate/lifecycle"
)

func main() {
	a, err := app.New(app.DefaultConfig("minimal", "127.0.0.1:0"),
		lifecycle.Phase{Name: "config", Run: func(context.Context, *lifecycle.Progress) error { return nil }})
	if err != nil {
		os.Exit(2)
	}
	os.Exit(a.Main())
}
