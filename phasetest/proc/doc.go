// Package proc runs a service as a separate process for a black-box test and
// watches the health its port answers.
//
// The steps: build its main package once per test binary (or take a binary),
// start it with arguments and environment, learn the address its port is
// bound to, follow its lifecycle through its event stream (a
// [phasetest.Stream]), signal it, wait for its exit code, and keep its
// output, printed when the test fails. The test's end kills and reaps a
// process still running; the binaries go when the test binary ends.
//
// The address comes from a file, not from the log: every process Start
// runs has [app.AddrFileEnv] naming a file of its own, which an App writes
// once its port is bound, before serve, whatever its --log-format. A test
// passes a listen address with port 0 (such as --listen 127.0.0.1:0) and
// calls [Process.Addr].
//
//	var bins proc.Builds
//
//	func TestMain(m *testing.M) { os.Exit(bins.Main(m)) }
//
//	func TestStartup(t *testing.T) {
//		p := proc.Start(t, bins.Build(t, "."), proc.Args("--listen", "127.0.0.1:0"))
//		s := p.Follow()
//		phasetest.WaitState(t, s, lifecycle.StateServing, time.Minute)
//		phasetest.AssertOrder(t, s.Events(0), "config", "db", "serve")
//		p.Signal(syscall.SIGTERM)
//		if code := p.Wait(time.Minute); code != 0 {
//			t.Fatalf("exit code %d", code)
//		}
//	}
//
// [WatchHealth] asks a port for its health over and over, in gRPC
// (grpc.health.v1 Watch) and HTTP (/readyz by default), and keeps the
// answers in order; [HealthWatch.AssertGated] then checks them against the
// lifecycle's events: NOT_SERVING and 503 until the lifecycle turned
// serving, SERVING and 200 after. It takes an address, so it serves an App
// started in process ([app.App.Addr]) as well as a process.
//
// This is a package of its own, not part of phasetest, so that a test of a
// lifecycle alone, which imports phasetest, does not link gRPC and the app
// package, which this one needs for the address file and the health
// clients.
package proc
