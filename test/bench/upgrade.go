package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"slices"
	"syscall"
	"time"
)

// Scenarios of the upgrade part.
const (
	scenUpgrade    = "SIGHUP in-place upgrade"
	scenRestart    = "SIGTERM + start, port closed between"
	scenRestartFDs = "SIGTERM + start, socket held (socket activation)"
)

// eventPause is the steady state kept before, between and after the
// scenario's events.
const eventPause = 500 * time.Millisecond

// heldSocket is a listening socket the benchmark keeps open across a
// daemon's stop and start, as systemd does for a socket unit, and hands
// to each daemon it starts (LISTEN_FDS). systemd-socket-activate cannot
// play that part: it executes the daemon in its own place, so its socket
// goes with the daemon's first exit.
type heldSocket struct {
	f    *os.File
	addr string
}

// holdSocket binds a loopback port and keeps its socket.
func holdSocket() (*heldSocket, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("hold a socket: %w", err)
	}
	defer l.Close() // the duplicate below keeps the socket listening
	f, err := l.(*net.TCPListener).File()
	if err != nil {
		return nil, fmt.Errorf("hold a socket: %w", err)
	}
	return &heldSocket{f: f, addr: l.Addr().String()}, nil
}

// file returns the socket's descriptor, nil for no held socket.
func (h *heldSocket) file() *os.File {
	if h == nil {
		return nil
	}
	return h.f
}

// measureUpgrade sends new connections at -probe-rate across -upgrades
// SIGHUP upgrades in a row, then across -restarts SIGTERM + start pairs
// with the port closed between them, then across as many with the socket
// held, with -upgrade-leases slots leased throughout and checked after
// each scenario.
func (r *runner) measureUpgrade(ctx context.Context) error {
	res := &UpgradeResult{Rate: r.o.probeRate, Leases: r.o.upLeases}
	r.res.Upgrade = res
	u, err := r.startUpgradeRun(ctx)
	if err != nil {
		return err
	}
	for _, s := range []struct {
		name   string
		events int
		step   func(context.Context) (event, error)
	}{
		{scenUpgrade, r.o.upgrades, u.upgrade},
		{scenRestart, r.o.restarts, u.restart(nil)},
	} {
		sc, err := r.scenario(ctx, s.name, u.d.addr, s.events, s.step)
		if err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		if sc.Destroyed, err = u.destroyed(); err != nil {
			return err
		}
		res.Scenarios = append(res.Scenarios, sc)
	}

	// The same with the socket held: a daemon started on it first.
	held, err := holdSocket()
	if err != nil {
		return err
	}
	defer held.f.Close()
	if _, err := u.d.stop(); err != nil {
		return err
	}
	if u.d, _, _, err = r.startServing(ctx, daemonArgs(r.h, held.addr, r.o, modeBackground, r.o.poolSize), held, startTimeout(r.o.upLeases, modeBackground)); err != nil {
		return err
	}
	sc, err := r.scenario(ctx, scenRestartFDs, held.addr, r.o.restarts, u.restart(held))
	if err != nil {
		return fmt.Errorf("%s: %w", scenRestartFDs, err)
	}
	if sc.Destroyed, err = u.destroyed(); err != nil {
		return err
	}
	res.Scenarios = append(res.Scenarios, sc)
	if _, err := u.d.stop(); err != nil {
		return err
	}
	return r.reset(ctx)
}

// upgradeRun is the upgrade part's daemon and the slots it leased: d
// changes at every restart (the runner ends whichever runs at a failure),
// before is what the leased slots were when the part began.
type upgradeRun struct {
	r       *runner
	d       *daemon
	indices []int
	before  map[int]slotID
}

// startUpgradeRun starts a daemon on a free port, waits for its pool,
// leases -upgrade-leases slots and notes what they are.
func (r *runner) startUpgradeRun(ctx context.Context) (*upgradeRun, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	d, _, _, err := r.startServing(ctx, daemonArgs(r.h, addr, r.o, modeBackground, r.o.poolSize), nil, startTimeout(0, modeBackground))
	if err != nil {
		return nil, err
	}
	if _, err := d.waitPoolFilled(ctx, 2*time.Minute); err != nil {
		return nil, err
	}
	leases, _, err := r.leaseSlots(ctx, d.slotsTarget(), r.o.upLeases, leaseOwner, nil)
	if err != nil {
		return nil, err
	}
	indices := indicesOf(leases)
	if _, err := d.waitPoolFilled(ctx, 2*time.Minute); err != nil {
		return nil, err
	}
	before, err := r.h.identities(indices)
	if err != nil {
		return nil, err
	}
	return &upgradeRun{r: r, d: d, indices: indices, before: before}, nil
}

// destroyed counts the leased slots that are no longer what they were.
func (u *upgradeRun) destroyed() (int, error) {
	now, err := u.r.h.identities(u.indices)
	return changed(u.before, now), err
}

// upgrade is one SIGHUP: it waits for the upgraded image to serve and
// reads how many leases it restored.
func (u *upgradeRun) upgrade(ctx context.Context) (event, error) {
	d := u.d
	served, restores := d.logs.count(msgServing), d.logs.count(msgRestore)
	e := event{at: time.Now()}
	if err := d.signal(syscall.SIGHUP); err != nil {
		return e, err
	}
	ev, err := d.logs.wait(ctx, msgServing, served, time.Minute, d.done)
	if err != nil {
		return e, fmt.Errorf("the upgraded image did not serve: %w\n%s", err, d.logs)
	}
	e.serving = ev.at
	rl, err := d.restoreLine(ctx, restores)
	e.restored = rl.Restored
	return e, err
}

// restart returns one SIGTERM + start on the same address (given the
// held socket, when not nil): it waits for the new daemon to serve and
// reads how many leases it restored.
func (u *upgradeRun) restart(held *heldSocket) func(context.Context) (event, error) {
	return func(ctx context.Context) (event, error) {
		e := event{at: time.Now()}
		if _, err := u.d.stop(); err != nil {
			return e, err
		}
		var (
			su  startup
			err error
		)
		r := u.r
		u.d, su, e.failures, err = r.startServing(ctx, daemonArgs(r.h, u.d.addr, r.o, modeBackground, r.o.poolSize), held, startTimeout(r.o.upLeases, modeBackground))
		if err != nil {
			return e, err
		}
		e.serving = su.ServingAt
		rl, err := u.d.restoreLine(ctx, 0)
		e.restored = rl.Restored
		return e, err
	}
}

// event is one upgrade or restart: when it was asked for, when a new
// image served again, and how many leases that image restored.
type event struct {
	at, serving time.Time
	restored    int
	failures    []string // starts that failed before the one that served
}

// scenario runs the probe generator against addr across events steps, a
// pause apart, and classifies what the probes got.
func (r *runner) scenario(ctx context.Context, name, addr string, events int, step func(context.Context) (event, error)) (Scenario, error) {
	sc := Scenario{Name: name, Events: events, Restored: -1}
	r.sampleLoad()
	t0 := time.Now()
	g, err := r.startLoadgen(addr, genProbe, r.o.probeRate, 10*time.Minute)
	if err != nil {
		return sc, err
	}
	if err := sleep(ctx, 2*eventPause); err != nil { // the generator's start and a steady state
		return sc, err
	}
	var gaps []float64
	for k := range events {
		e, err := step(ctx)
		if err != nil {
			g.kill()
			return sc, fmt.Errorf("event %d: %w", k+1, err)
		}
		gaps = append(gaps, ms(e.serving.Sub(e.at)))
		sc.FailedStarts = append(sc.FailedStarts, e.failures...)
		sc.EventsMs = append(sc.EventsMs, ms(e.at.Sub(t0)))
		if sc.Restored < 0 || e.restored < sc.Restored {
			sc.Restored = e.restored
		}
		if err := sleep(ctx, eventPause); err != nil {
			g.kill()
			return sc, err
		}
	}
	samples, err := g.finish(true, time.Minute)
	if err != nil {
		return sc, err
	}
	sc.GapMs = summarize(gaps)
	classify(&sc, samples, t0)
	r.logf("%s: %d events (signal → SERVING %s), %d probes: %d SERVING, %d NOT_SERVING, %d refused, %d failed; restored ≥ %d",
		name, events, fmtSummary(sc.GapMs), sc.Probes, sc.Serving, sc.NotServing, sc.Refused, sc.Failed, sc.Restored)
	return sc, nil
}

// bucketWidth is the width of a Scenario's Series buckets.
const bucketWidth = 100 * time.Millisecond

// classify counts the probes by outcome, into totals and 100 ms buckets
// from t0.
func classify(sc *Scenario, samples []sample, t0 time.Time) {
	slices.SortFunc(samples, func(a, b sample) int { return int(a.At - b.At) })
	var lat []float64
	for _, s := range samples {
		k := max(int(time.Duration(s.At-t0.UnixNano())/bucketWidth), 0)
		for len(sc.Series) <= k {
			sc.Series = append(sc.Series, Bucket{})
		}
		b := &sc.Series[k]
		sc.Probes++
		switch {
		case s.Out == outRefused:
			sc.Refused++
			b.Refused++
		case s.Out != "" || s.Err != "":
			sc.Failed++
			b.Failed++
		case s.Answer == "SERVING" || s.Answer == "200":
			sc.Serving++
			b.Serving++
		default:
			sc.NotServing++
			b.NotServing++
		}
		if s.Err != "" && s.Out != outRefused && sc.FirstError == "" {
			sc.FirstError = s.Err
		}
		if s.Err == "" {
			l := ms(time.Duration(s.Latency))
			lat = append(lat, l)
			b.MaxMs = max(b.MaxMs, l)
		}
	}
	slices.Sort(lat)
	sc.LatencyP99Ms = percentile(lat, 0.99)
	if len(lat) > 0 {
		sc.LatencyMaxMs = lat[len(lat)-1]
	}
}
