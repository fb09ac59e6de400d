package compare

import (
	"context"
	"testing"
	"time"

	"github.com/oklog/run"
	"go.uber.org/fx"

	"github.com/phasegate/phasegate/app"
	"github.com/phasegate/phasegate/lifecycle"
)

// The seven steps of the lifecycle package's BenchmarkStartSevenPhases —
// the daemon's graph with no-op bodies — run by each engine, side by side
// in one run:
//
//	lock ──► listen ─────────────────────────► register ──► serve
//	   └──► reclaim ──► storage ──► populate ──┘
//
// phasegate declares it as phases and runs independent ones concurrently.
// fx has no phases: the equivalent is seven constructors whose parameter
// types are the dependencies, each appending a no-op OnStart and OnStop
// hook; fx orders the hooks by the constructors' order and runs them one
// after the other. run has neither ordering nor a start: the closest is a
// group of seven actors that return at once, which measures what a run.Group
// costs to start and stop (one goroutine per actor), not a startup.

func nop(context.Context, *lifecycle.Progress) error { return nil }

func sevenPhases() []lifecycle.Phase {
	stop := func(context.Context) error { return nil }
	return []lifecycle.Phase{
		{Name: "lock", Run: nop, Stop: stop},
		{Name: "listen", DependsOn: []string{"lock"}, Run: nop, Stop: stop},
		{Name: "reclaim", DependsOn: []string{"lock"}, Run: nop, Stop: stop},
		{Name: "storage", DependsOn: []string{"reclaim"}, Run: nop, Stop: stop},
		{Name: "populate", DependsOn: []string{"storage"}, Run: nop, Stop: stop},
		{Name: "register", DependsOn: []string{"listen", "populate"}, Run: nop, Stop: stop},
		{Name: "serve", DependsOn: []string{"register"}, Run: nop, Stop: stop},
	}
}

type (
	lock     struct{}
	listen   struct{}
	reclaim  struct{}
	storage  struct{}
	populate struct{}
	register struct{}
	serve    struct{}
)

func hook(lc fx.Lifecycle) {
	lc.Append(fx.Hook{
		OnStart: func(context.Context) error { return nil },
		OnStop:  func(context.Context) error { return nil },
	})
}

func fxSeven() *fx.App {
	return fx.New(
		fx.NopLogger,
		fx.Provide(
			func(lc fx.Lifecycle) *lock { hook(lc); return &lock{} },
			func(lc fx.Lifecycle, _ *lock) *listen { hook(lc); return &listen{} },
			func(lc fx.Lifecycle, _ *lock) *reclaim { hook(lc); return &reclaim{} },
			func(lc fx.Lifecycle, _ *reclaim) *storage { hook(lc); return &storage{} },
			func(lc fx.Lifecycle, _ *storage) *populate { hook(lc); return &populate{} },
			func(lc fx.Lifecycle, _ *listen, _ *populate) *register { hook(lc); return &register{} },
			func(lc fx.Lifecycle, _ *register) *serve { hook(lc); return &serve{} },
		),
		fx.Invoke(func(*serve) {}),
	)
}

func runSeven() *run.Group {
	var g run.Group
	for range 7 {
		g.Add(func() error { return nil }, func(error) {})
	}
	return &g
}

// BenchmarkStartSevenSteps is New + Start: what the lifecycle package's
// BenchmarkStartSevenPhases measures, for each engine.
func BenchmarkStartSevenSteps(b *testing.B) {
	ctx := context.Background()
	b.Run("engine=phasegate", func(b *testing.B) {
		b.ReportAllocs()
		phases := sevenPhases()
		for b.Loop() {
			lc, err := lifecycle.New(phases)
			if err != nil {
				b.Fatal(err)
			}
			if err := lc.Start(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("engine=fx", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			a := fxSeven()
			if err := a.Start(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkStartStopSevenSteps is a whole life: New, Start, then the
// orderly stop (phasegate's Drain, fx's Stop, run's Group.Run, which
// starts and stops its actors).
func BenchmarkStartStopSevenSteps(b *testing.B) {
	ctx := context.Background()
	b.Run("engine=phasegate", func(b *testing.B) {
		b.ReportAllocs()
		phases := sevenPhases()
		for b.Loop() {
			lc, err := lifecycle.New(phases)
			if err != nil {
				b.Fatal(err)
			}
			if err := lc.Start(ctx); err != nil {
				b.Fatal(err)
			}
			if err := lc.Drain(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("engine=fx", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			a := fxSeven()
			if err := a.Start(ctx); err != nil {
				b.Fatal(err)
			}
			if err := a.Stop(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("engine=run", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = runSeven().Run()
		}
	})
}

// BenchmarkAppStartStop is what the whole phasegate runner costs around
// five no-op phases of one's own (the seven with the App's listen and
// serve): the port bound on loopback, health,
// metrics, the event log, the drain. There is no fx or run equivalent
// that does the same work; it is here for scale.
func BenchmarkAppStartStop(b *testing.B) {
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		cfg := app.DefaultConfig("bench", "127.0.0.1:0")
		cfg.DrainDelay = 0
		cfg.StopTimeout = 10 * time.Second
		a, err := app.New(cfg, // the App adds listen and serve
			lifecycle.Phase{Name: "lock", Run: nop},
			lifecycle.Phase{Name: "reclaim", DependsOn: []string{"lock"}, Run: nop},
			lifecycle.Phase{Name: "storage", DependsOn: []string{"reclaim"}, Run: nop},
			lifecycle.Phase{Name: "populate", DependsOn: []string{"storage"}, Run: nop},
			lifecycle.Phase{Name: "register", DependsOn: []string{"populate", app.PhaseListen}, Run: nop},
		)
		if err != nil {
			b.Fatal(err)
		}
		if err := a.Start(ctx); err != nil {
			b.Fatal(err)
		}
		if err := a.Stop(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
