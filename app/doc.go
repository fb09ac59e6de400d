// Package app runs a service whose startup is a declared graph of phases.
//
// It gives one port for gRPC and HTTP that binds in milliseconds, health
// that tells the truth in every dialect from then on (grpc.health.v1;
// /health for Nomad and Consul; /livez, /readyz and /startupz for
// Kubernetes; sd_notify for systemd), a span per phase and metrics (exported
// by the exporters Config gives: a binary links no other), the start as a
// timeline at /debug/startup, and signals.
//
// An App is a [lifecycle.Lifecycle] with two phases of its own: listen,
// which binds the port (after Config.ListenAfter, usually nothing), and
// serve, after every other phase, whose success opens the gate:
//
//	a, err := app.New(app.DefaultConfig("catalog", ":7000"),
//		lifecycle.Phase{Name: "config", Run: loadConfig},
//		lifecycle.Phase{Name: "migrate", DependsOn: []string{"config"}, Run: migrate},
//		lifecycle.Phase{Name: "register", DependsOn: []string{"migrate", app.PhaseListen}, Run: register},
//	)
//	if err != nil {
//		log.Fatal(err)
//	}
//	_ = a.Server().Declare(&catalogv1.Catalog_ServiceDesc) // bound by register
//	os.Exit(a.Main())
//
// [App.Run] blocks until SIGINT, SIGTERM or SIGHUP and then drains in
// order: health turns NOT_SERVING, the drain delay lets checkers notice,
// the port stops gracefully, then the phases' Stop functions run in reverse
// dependency order. A second signal cuts the waits short. A failure after
// serving (the listener dies, or [lifecycle.Lifecycle.Fail]) turns health
// to failing and makes Run drain and return the cause, so the process exits
// non-zero and its supervisor restarts it. Tests use [App.Start] and
// [App.Stop] instead.
//
// A listening socket handed over by systemd socket activation (LISTEN_FDS)
// is used instead of binding Config.Listen.
//
// A process that starts the App's process learns the port's address from a
// file, not from the log: with [AddrFileEnv] (PHASEGATE_ADDR_FILE) naming
// one, listen writes the bound address there, whole, before serve; package
// phasetest/proc sets it for every process it starts.
package app
