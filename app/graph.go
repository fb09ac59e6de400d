package app

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"slices"
	"syscall"
	"time"

	"github.com/phasegate/phasegate/lifecycle"
)

// graph returns the phases with the App's own: listen, after ListenAfter,
// and serve, after every phase that nothing depends on.
func (a *App) graph(phases []lifecycle.Phase) []lifecycle.Phase {
	depended := map[string]bool{}
	for _, p := range phases {
		for _, d := range p.DependsOn {
			depended[d] = true
		}
	}
	serveAfter := []string{PhaseListen}
	for _, p := range phases {
		if !depended[p.Name] && p.Name != PhaseListen {
			serveAfter = append(serveAfter, p.Name)
		}
	}
	budget := a.cfg.StopBudget()
	// The listen phase's stop drains the port when the start fails before
	// serve; after serve, serve's stop has done it already.
	listen := lifecycle.Phase{Name: PhaseListen, DependsOn: a.cfg.ListenAfter, Run: a.runListen, Stop: a.stopServer, StopTimeout: budget}
	// Declared right after the phases it waits for, so that views that
	// list phases in declaration order read in the order things happen.
	at := 0
	for i, p := range phases {
		if slices.Contains(a.cfg.ListenAfter, p.Name) {
			at = i + 1
		}
	}
	out := slices.Insert(slices.Clone(phases), at, listen)
	return append(out, lifecycle.Phase{Name: PhaseServe, DependsOn: serveAfter, Run: runServe, Stop: a.stopServer, StopTimeout: budget})
}

func (a *App) runListen(ctx context.Context, _ *lifecycle.Progress) error {
	listen, err := a.resolvePort()
	if err != nil {
		return lifecycle.Permanent(err)
	}
	if err := a.srv.Serve(ctx); err != nil {
		err = fmt.Errorf("listen on %s: %w", listen, err)
		if addressRefused(err) {
			err = fmt.Errorf("%w: %w", ErrConfig, err)
		}
		return lifecycle.Permanent(err)
	}
	a.mu.Lock()
	a.addr = a.srv.Addr()
	a.mu.Unlock()
	close(a.addrCh)
	if err := reportAddr(a.addr); err != nil {
		_ = a.stopServer(ctx) // at once: it never served
		return lifecycle.Permanent(err)
	}
	a.logCaughtUp() // after "phase started phase=listen"
	a.log.Info("listening", "addr", a.addr.String(), "tls", a.cfg.TLS != nil)
	return nil
}

// resolvePort asks Config.PortFrom, when set, for the address and the
// drain delay a phase decided, checks them and gives them to the server;
// it returns the address to bind.
func (a *App) resolvePort() (string, error) {
	if a.cfg.PortFrom == nil {
		return a.cfg.Listen, nil
	}
	p, err := a.cfg.PortFrom()
	if err != nil {
		return "", fmt.Errorf("%w: PortFrom: %w", ErrConfig, err)
	}
	if p.Listen == "" && a.handedAddr == nil {
		return "", fmt.Errorf("%w: PortFrom gave no address to listen on (did a phase of ListenAfter %q fill it?)", ErrConfig, a.cfg.ListenAfter)
	}
	if ceiling := a.cfg.drainCeiling(); p.DrainDelay < 0 || p.DrainDelay > ceiling {
		return "", fmt.Errorf("%w: PortFrom gave a drain delay of %v: want 0 to Config.MaxDrainDelay, %v, from which the stop budgets were computed",
			ErrConfig, p.DrainDelay, ceiling)
	}
	if err := a.srv.SetPort(p.Listen, p.DrainDelay); err != nil {
		return "", fmt.Errorf("%w: PortFrom: %w", ErrConfig, err)
	}
	return p.Listen, nil
}

// addressRefused reports whether err, a bind's, is the address's fault:
// not host:port, a name that does not resolve, an address the host does
// not have, a port in use or one the process may not bind. The same
// address fails every start alike: a configuration error (exit 2), whether
// Config.Listen or PortFrom gave it.
func addressRefused(err error) bool {
	var addrErr *net.AddrError
	var dnsErr *net.DNSError
	return errors.As(err, &addrErr) || errors.As(err, &dnsErr) || errors.Is(err, syscall.EADDRINUSE) ||
		errors.Is(err, syscall.EADDRNOTAVAIL) || errors.Is(err, syscall.EACCES)
}

// runServe has nothing left to do: the lifecycle turns serving when it
// returns, which opens the gate for application calls, turns health
// SERVING and sends READY=1.
func runServe(context.Context, *lifecycle.Progress) error { return nil }

// stopServer drains the port: the stop of listen and of serve, whichever
// runs first. A lifecycle that never served never opened the gate, so no
// checker can have routed traffic to the port and no application call is
// in flight: the drain delay is skipped, and a start that fails or is
// drained before serving ends in milliseconds.
func (a *App) stopServer(ctx context.Context) error {
	if !a.everServed() {
		a.srv.SkipDrainDelay()
	}
	return a.srv.Drain(ctx)
}

// everServed reports whether the lifecycle ever turned serving.
func (a *App) everServed() bool {
	for _, t := range a.lc.Snapshot().History {
		if t.State == lifecycle.StateServing {
			return true
		}
	}
	return false
}

// stopBudget is the longest the stops can take: they run one after the
// other, each within its own bound (the phase's StopTimeout, else
// Config.StopTimeout); the port's drain, a stop of both listen and serve,
// runs once; and background tasks get one more StopTimeout to return. Zero
// when any stop is unbounded.
func stopBudget(graph []lifecycle.Phase, cfg Config) time.Duration {
	if cfg.StopTimeout == 0 {
		return 0
	}
	total := cfg.StopBudget() + cfg.StopTimeout // the port, once; the tasks
	for _, p := range graph {
		if p.Stop == nil || p.Name == PhaseListen || p.Name == PhaseServe {
			continue
		}
		d := p.StopTimeout
		if d == 0 {
			d = cfg.StopTimeout
		}
		total += d
	}
	return total
}

// startBudget is the longest the start of graph can take before it
// fails: the phases' worst cases ([lifecycle.Phase.WorstCase]) summed
// along the slowest chain of dependencies (phases apart run in parallel),
// the App's own listen and serve counted as nothing, and never more than
// Config.StartTimeout. Zero when unbounded: a phase on some chain has no
// Timeout and there is no StartTimeout. graph must be valid (New checked
// it has no cycle).
func startBudget(graph []lifecycle.Phase, cfg Config) time.Duration {
	byName := make(map[string]lifecycle.Phase, len(graph))
	for _, p := range graph {
		byName[p.Name] = p
	}
	const unbounded = time.Duration(-1)
	done := map[string]time.Duration{} // the longest chain ending with the phase
	var finish func(name string) time.Duration
	finish = func(name string) time.Duration {
		if d, ok := done[name]; ok {
			return d
		}
		p := byName[name]
		own, bounded := p.WorstCase()
		if name == PhaseListen || name == PhaseServe {
			own, bounded = 0, true
		}
		longest := time.Duration(0)
		for _, dep := range p.DependsOn {
			d := finish(dep)
			if d == unbounded {
				longest = unbounded
				break
			}
			longest = max(longest, d)
		}
		d := unbounded
		if bounded && longest != unbounded {
			d = saturatedSum(longest, own)
		}
		done[name] = d
		return d
	}
	total := time.Duration(0)
	for _, p := range graph {
		d := finish(p.Name)
		if d == unbounded {
			return cfg.StartTimeout
		}
		total = max(total, d)
	}
	if cfg.StartTimeout > 0 {
		total = min(total, cfg.StartTimeout)
	}
	return total
}

// saturatedSum is a+b, or the longest Duration when that overflows.
func saturatedSum(a, b time.Duration) time.Duration {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}
