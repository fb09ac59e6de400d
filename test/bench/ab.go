package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// The ab part puts two builds of the daemon side by side in one run: the
// same starts and the same health checks, the sides taking turns, so that
// whatever else the shared machine does in those minutes falls on both.
// It measures what a change on the port's path (how a new connection is
// taken and its protocol decided) could cost: exec → the first answer on
// the port, and health checks made as checkers make them, a new TCP
// connection each, plain and over TLS.

// Sides of the ab part.
const (
	sideA = 0 // -ab-binary: the baseline
	sideB = 1 // -binary, or the checkout's build
)

// abOptions are the ab part's settings, from its flags.
type abOptions struct {
	binary   string
	reps     int
	starts   int
	rates    []int
	tlsRates []int
	window   time.Duration
	slot     time.Duration
	tls      bool
}

// register adds the ab part's flags to fs; the rates are parsed from the
// returned strings by parse.
func (a *abOptions) register(fs *flag.FlagSet) (rates, tlsRates *string) {
	fs.StringVar(&a.binary, "ab-binary", "", "part ab: the baseline build, side A, beside -binary (side B, default the checkout's build); empty: A is B too, an A/A run that shows the noise")
	fs.IntVar(&a.reps, "ab-reps", 10, "part ab: rounds, each side in each, the order turning from round to round (ABBA)")
	fs.IntVar(&a.starts, "ab-starts", 3, "part ab: starts of each side (and mode) in a round, each timed to its first answer; the first one's daemon then takes the health checks")
	rates = fs.String("ab-rates", "500,1000,2000", "part ab: health checks per second in each window, a new TCP connection each, half HTTP GET /health and half gRPC Check; one window per rate")
	tlsRates = fs.String("ab-tls-rates", "500", "part ab: the same over TLS, a full handshake each (at 1,000 a second, two shared cores are overloaded)")
	fs.DurationVar(&a.window, "ab-window", 4*time.Second, "part ab: the length of each window of checks, a whole number of 4 × -ab-slot")
	fs.DurationVar(&a.slot, "ab-slot", 500*time.Millisecond, "part ab: in a window, how long the checks go to one side's daemon before the other's, in ABBA order")
	fs.BoolVar(&a.tls, "ab-tls", true, "part ab: also with the daemon serving TLS (--tls-cert), a full handshake each check")
	return rates, tlsRates
}

// parse checks the settings and parses the rates.
func (a *abOptions) parse(rates, tlsRates string) error {
	var err error
	if a.rates, err = parseRates("-ab-rates", rates); err != nil {
		return err
	}
	if a.tlsRates, err = parseRates("-ab-tls-rates", tlsRates); err != nil {
		return err
	}
	switch {
	case a.reps < 1, a.starts < 1:
		return errors.New("-ab-reps and -ab-starts must be ≥ 1")
	case a.window <= 0 || a.window > loadgenMaxDuration:
		return fmt.Errorf("-ab-window must be in (0, %v]", loadgenMaxDuration)
	case a.slot <= 0 || a.window%(4*a.slot) != 0:
		return errors.New("-ab-window must be a whole number of 4 × -ab-slot: each side gets as many slots, first as often as second")
	}
	return nil
}

// parseRates parses "500,2000" into rates in [2, 5000].
func parseRates(flag, s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 2 || n > 5000 {
			return nil, fmt.Errorf("%s: %q is not a rate in [2, 5000]", flag, f)
		}
		out = append(out, n)
	}
	return out, nil
}

// ratesOf are the rates of a mode's windows.
func (a abOptions) ratesOf(tls bool) []int {
	if tls {
		return a.tlsRates
	}
	return a.rates
}

// modes are the ways the port is served: plain, and TLS with -ab-tls.
func (a abOptions) modes() []bool {
	if a.tls {
		return []bool{false, true}
	}
	return []bool{false}
}

// ABResult is the ab part: side A (Sides[0], -ab-binary) beside side B
// (Sides[1], -binary). Runs holds every timed start in the order it ran,
// Windows every window of checks, each side's; Checks the checks pooled
// over the rounds.
type ABResult struct {
	// Sides are the builds' file names, as given.
	Sides    [2]string  `json:"sides"`
	Reps     int        `json:"reps"`
	Starts   int        `json:"startsPerRep"`
	Rates    []int      `json:"ratesPerS"`
	TLSRates []int      `json:"tlsRatesPerS,omitempty"`
	WindowMs float64    `json:"windowMs"`
	SlotMs   float64    `json:"slotMs"`
	TLS      bool       `json:"tls"`
	Checks   []ABChecks `json:"checks"`
	Runs     []ABRun    `json:"runs"`
	Windows  []ABWindow `json:"windows"`
}

// ABChecks is one kind of check at one rate, plain or over TLS: each
// side's, pooled over the rounds.
type ABChecks struct {
	TLS  bool            `json:"tls,omitempty"`
	Rate int             `json:"ratePerS"`
	Kind string          `json:"kind"`
	Side [2]LatencyStats `json:"side"`
}

// ABRun is one timed start of one side, from its exec.
type ABRun struct {
	Rep  int  `json:"rep"`
	Side int  `json:"side"`
	TLS  bool `json:"tls,omitempty"`
	// FirstAnswerMs is exec → the first HTTP answer on the port (any
	// status), FirstGRPCMs → the first health Watch message, ServingMs →
	// SERVING.
	FirstAnswerMs float64 `json:"firstAnswerMs"`
	FirstStatus   int     `json:"firstStatus"`
	FirstGRPCMs   float64 `json:"firstGrpcMs"`
	ServingMs     float64 `json:"servingMs"`
	// FailedStarts says why a start failed before the one measured;
	// StopError why its stop (SIGTERM) did not end cleanly, if it did not
	// (what it kept is removed all the same).
	FailedStarts []string `json:"failedStarts,omitempty"`
	StopError    string   `json:"stopError,omitempty"`
	// LoadStart and LoadEnd are the 1-minute load average around it.
	LoadStart float64 `json:"loadStart"`
	LoadEnd   float64 `json:"loadEnd"`
}

// ABWindow is what one side's daemon answered in a window of checks at
// Rate: the checks sent to it (in its slots of the window) by kind.
type ABWindow struct {
	Rep    int                     `json:"rep"`
	Side   int                     `json:"side"`
	TLS    bool                    `json:"tls,omitempty"`
	Rate   int                     `json:"ratePerS"`
	Checks map[string]LatencyStats `json:"checks"`
	// CPUMs is the daemon's user and system time over the window, its
	// idle slots included.
	CPUMs float64 `json:"daemonCpuMs"`
	// Refused are the connections the port refused in the window, by
	// reason (its phasegate_conns_refused_total), if any.
	Refused map[string]int `json:"refused,omitempty"`
	// LoadStart and LoadEnd are the 1-minute load average around it.
	LoadStart float64 `json:"loadStart"`
	LoadEnd   float64 `json:"loadEnd"`
}

// abKey names the samples pooled for one side, mode and rate.
type abKey struct {
	side int
	tls  bool
	rate int
}

// abSide is one side's build and the share of the machine its daemons
// use: a prefix, directories and a slot range of its own, so that both
// sides' daemons can serve at once.
type abSide struct {
	name string
	bin  string
	h    *host
}

// abSlots are the slot indices of each side's host: the warm pool and
// its refills.
const abSlots = 64

// measureAB runs -ab-reps rounds. In each, every side is started
// -ab-starts times in each mode, timed to its first answer and SERVING,
// the sides taking turns start by start and the first side changing from
// round to round (AB, BA, …); then, in each mode, a daemon of each side
// is started and, once both pools are full, the two take the checks of
// one load generator in turn, -ab-slot each in ABBA order, for -ab-window
// at each rate. Every daemon is stopped and what it kept removed with its
// own build's decommission.
func (r *runner) measureAB(ctx context.Context) (err error) {
	bins := [2]string{r.o.ab.binary, r.bin}
	if bins[sideA] == "" {
		bins[sideA] = r.bin
	}
	res := newABResult(r.o.ab, bins)
	var sides [2]*abSide
	defer func() {
		for _, sd := range sides {
			if sd != nil {
				if serr := sd.h.sweep(); serr != nil {
					err = errors.Join(err, fmt.Errorf("sweep of prefix %q: %w", sd.h.cfg.Prefix, serr))
				}
			}
		}
	}()
	for i := range sides {
		cidr, err := abCIDR(r.o.cidr, i)
		if err != nil {
			return err
		}
		h, err := newHost(abSlots, cidr, r.o.stateParent)
		if err != nil {
			return err
		}
		sides[i] = &abSide{name: res.Sides[i], bin: bins[i], h: h}
		r.logf("ab side %s: %s, prefix %s, slots in %s", "AB"[i:i+1], bins[i], h.cfg.Prefix, cidr)
	}
	var cert certFiles
	if r.o.ab.tls {
		if cert.cert, cert.key, err = selfSignedCert(r.h.base); err != nil {
			return err
		}
	}
	// What was measured is kept if a later round fails: the part is then
	// marked incomplete.
	r.res.AB = res
	pooled := map[abKey][]sample{}
	defer func() { res.Checks = append(res.Checks, abChecks(r.o.ab, pooled)...) }()
	for rep := range r.o.ab.reps {
		if err := r.abRound(ctx, rep, sides, cert, res, pooled); err != nil {
			return err
		}
	}
	return nil
}

// newABResult is part ab's result before anything is measured: its
// settings and the sides' names (the binaries', told apart when equal).
func newABResult(o abOptions, bins [2]string) *ABResult {
	res := &ABResult{Reps: o.reps, Starts: o.starts, Rates: o.rates, WindowMs: ms(o.window),
		SlotMs: ms(o.slot), TLS: o.tls}
	if o.tls {
		res.TLSRates = o.tlsRates
	}
	for i, b := range bins {
		res.Sides[i] = filepath.Base(b)
	}
	if res.Sides[sideA] == res.Sides[sideB] {
		res.Sides[sideA] += " (A)"
		res.Sides[sideB] += " (B)"
	}
	return res
}

// abChecks summarizes the checks pooled over every round, per mode, rate
// and kind, side A beside side B.
func abChecks(o abOptions, pooled map[abKey][]sample) []ABChecks {
	var out []ABChecks
	for _, tls := range o.modes() {
		for _, rate := range o.ratesOf(tls) {
			a, b := latencyByKind(pooled[abKey{sideA, tls, rate}]), latencyByKind(pooled[abKey{sideB, tls, rate}])
			for _, kind := range []string{kindGRPC, kindHTTP} {
				out = append(out, ABChecks{TLS: tls, Rate: rate, Kind: kind, Side: [2]LatencyStats{a[kind], b[kind]}})
			}
		}
	}
	return out
}

// abRound is round rep of part ab: the timed starts, the sides taking
// turns (the first side changes from round to round), then the checks'
// windows in each mode, their samples added to pooled.
func (r *runner) abRound(ctx context.Context, rep int, sides [2]*abSide, cert certFiles, res *ABResult, pooled map[abKey][]sample) error {
	r.sampleLoad()
	order := []int{sideA, sideB}
	if rep%2 == 1 {
		order = []int{sideB, sideA}
	}
	for range r.o.ab.starts {
		for _, side := range order {
			for _, tls := range r.o.ab.modes() {
				run, err := r.abStart(ctx, sides[side], tls, cert)
				if err != nil {
					return fmt.Errorf("round %d, %s: %w", rep+1, res.Sides[side], err)
				}
				run.Rep, run.Side = rep, side
				res.Runs = append(res.Runs, run)
				r.logf("ab round %d %s%s: %s", rep+1, res.Sides[side], map[bool]string{true: " TLS"}[tls], run.summary())
			}
		}
	}
	for _, tls := range r.o.ab.modes() {
		ws, samples, err := r.abWindows(ctx, sides, order, tls, cert)
		if err != nil {
			return fmt.Errorf("round %d, windows: %w", rep+1, err)
		}
		for _, w := range ws {
			w.Rep = rep
			res.Windows = append(res.Windows, w)
			r.logf("ab round %d %s%s: %s", rep+1, res.Sides[w.Side], map[bool]string{true: " TLS"}[tls], w.summary())
		}
		for k, s := range samples {
			pooled[k] = append(pooled[k], s...)
		}
	}
	return nil
}

// abCIDR is side's slot range: the side-th /24 of cidr.
func abCIDR(cidr string, side int) (string, error) {
	p, err := netip.ParsePrefix(cidr)
	if err != nil || !p.Addr().Is4() || p.Bits() > 23 {
		return "", fmt.Errorf("-cidr %s: part ab needs an IPv4 range of two /24s at least", cidr)
	}
	a := p.Masked().Addr().As4()
	a[2] += byte(side)
	return netip.PrefixFrom(netip.AddrFrom4(a), 24).String(), nil
}

// certFiles are the TLS certificate and key a daemon serves with -ab-tls.
type certFiles struct{ cert, key string }

// abArgs are the flags of a side's daemon on addr, with TLS serving cert.
func (r *runner) abArgs(sd *abSide, addr string, tls bool, cert certFiles) []string {
	args := daemonArgs(sd.h, addr, r.o, modeBackground, r.o.poolSize)
	if tls {
		args = append(args, "--tls-cert="+cert.cert, "--tls-key="+cert.key)
	}
	return args
}

// abStart starts a side's daemon, times its start, stops it and removes
// what it kept.
func (r *runner) abStart(ctx context.Context, sd *abSide, tls bool, cert certFiles) (run ABRun, err error) {
	run.TLS, run.LoadStart = tls, loadAvg()
	addr, err := freeAddr()
	if err != nil {
		return run, err
	}
	d, su, failures, err := r.startServingBin(ctx, sd.bin, r.abArgs(sd, addr, tls, cert), nil, startTimeout(0, modeBackground))
	if err != nil {
		return run, errors.Join(err, r.resetOn(ctx, sd.bin, sd.h))
	}
	run.FirstAnswerMs, run.FirstStatus = ms(su.FirstAnswer), su.FirstStatus
	run.FirstGRPCMs, run.ServingMs, run.FailedStarts = ms(su.FirstGRPC), ms(su.Serving), failures
	// Stopped once its pool is full, as the windows' daemons are: a stop
	// during the fill waits for the slots being made, which on a machine
	// busy with namespaces can take longer than --stop-timeout.
	_, err = d.waitPoolFilled(ctx, 2*time.Minute)
	if err == nil {
		if _, serr := d.stop(); serr != nil {
			run.StopError = oneLine(serr)
		}
	} else {
		d.kill()
	}
	if err = errors.Join(err, r.resetOn(ctx, sd.bin, sd.h)); err != nil {
		return run, err
	}
	run.LoadEnd = loadAvg()
	return run, nil
}

// abWindows starts a daemon of each side, in order, and once both pools
// are full sends a window of checks at each rate of the mode: one load
// generator, its probes to the two daemons in turn. It returns each
// side's windows and the samples by side and rate; the daemons are
// stopped and what they kept removed before it returns.
func (r *runner) abWindows(ctx context.Context, sides [2]*abSide, order []int, tls bool, cert certFiles) (ws []ABWindow, pooled map[abKey][]sample, err error) {
	var ds [2]*daemon
	defer func() {
		for i, d := range ds {
			if d == nil {
				continue
			}
			if err != nil {
				d.kill()
			} else if _, serr := d.stop(); serr != nil {
				r.logf("ab %s: its stop did not end cleanly (%s); what it kept is removed", sides[i].name, oneLine(serr))
			}
			err = errors.Join(err, r.resetOn(ctx, sides[i].bin, sides[i].h))
		}
	}()
	for _, side := range order {
		addr, err := freeAddr()
		if err != nil {
			return nil, nil, err
		}
		if ds[side], _, _, err = r.startServingBin(ctx, sides[side].bin, r.abArgs(sides[side], addr, tls, cert), nil, startTimeout(0, modeBackground)); err != nil {
			return nil, nil, err
		}
	}
	for _, d := range ds {
		if _, err := d.waitPoolFilled(ctx, 2*time.Minute); err != nil {
			return nil, nil, err
		}
	}
	pooled = map[abKey][]sample{}
	extra := []string{"-addr2", ds[sideB].addr, "-slot", r.o.ab.slot.String()}
	if tls {
		extra = append(extra, "-tls-cert", cert.cert)
	}
	for _, rate := range r.o.ab.ratesOf(tls) {
		var refused0 [2]map[string]int
		var cpu0 [2]time.Duration
		load0 := loadAvg()
		for i, d := range ds {
			if refused0[i], err = d.connsRefused(ctx); err != nil {
				return nil, nil, err
			}
			cpu0[i] = procCPU(d.cmd.Process.Pid)
		}
		g, err := r.startLoadgen(ds[sideA].addr, genProbe, rate, r.o.ab.window, extra...)
		if err != nil {
			return nil, nil, err
		}
		samples, err := g.finish(false, r.o.ab.window+time.Minute)
		if err != nil {
			return nil, nil, err
		}
		bySide := [2][]sample{}
		for _, s := range samples {
			bySide[s.Side] = append(bySide[s.Side], s)
		}
		for i, d := range ds {
			w := ABWindow{Side: i, TLS: tls, Rate: rate, Checks: latencyByKind(bySide[i]), CPUMs: ms(procCPU(d.cmd.Process.Pid) - cpu0[i]),
				LoadStart: load0, LoadEnd: loadAvg()}
			refused, err := d.connsRefused(ctx)
			if err != nil {
				return nil, nil, err
			}
			for reason, n := range refused {
				if n -= refused0[i][reason]; n > 0 {
					if w.Refused == nil {
						w.Refused = map[string]int{}
					}
					w.Refused[reason] = n
				}
			}
			ws = append(ws, w)
			pooled[abKey{i, tls, rate}] = bySide[i]
		}
	}
	return ws, pooled, nil
}

// connsRefused reads the port's refused connections by reason from the
// daemon's /metrics (phasegate_conns_refused_total{surface="port"}).
func (d *daemon) connsRefused(ctx context.Context) (map[string]int, error) {
	b, err := d.get(ctx, "/metrics")
	if err != nil {
		return nil, fmt.Errorf("GET /metrics: %w", err)
	}
	out := map[string]int{}
	for line := range strings.SplitSeq(string(b), "\n") {
		labels, ok := strings.CutPrefix(line, "phasegate_conns_refused_total{")
		if !ok || !strings.Contains(labels, `surface="port"`) {
			continue
		}
		_, reason, _ := strings.Cut(labels, `reason="`)
		reason, _, _ = strings.Cut(reason, `"`)
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return nil, fmt.Errorf("GET /metrics: %q: %w", line, err)
		}
		out[reason] = int(v)
	}
	return out, nil
}

// summary is a start's progress line.
func (run ABRun) summary() string {
	s := fmt.Sprintf("first answer %s (HTTP %d), first gRPC %s, SERVING %s; load %.2f–%.2f", fmtMs(run.FirstAnswerMs), run.FirstStatus,
		fmtMs(run.FirstGRPCMs), fmtMs(run.ServingMs), run.LoadStart, run.LoadEnd)
	if run.StopError != "" {
		s += "; its stop: " + run.StopError
	}
	return s
}

// summary is a window's progress line.
func (w ABWindow) summary() string {
	g, h := w.Checks[kindGRPC], w.Checks[kindHTTP]
	return fmt.Sprintf("%d/s: gRPC p50 %s p99 %s, HTTP p50 %s p99 %s, %d checks, %d errors, refused %v, daemon CPU %s; load %.2f–%.2f", w.Rate,
		fmtMs(g.P50Ms), fmtMs(g.P99Ms), fmtMs(h.P50Ms), fmtMs(h.P99Ms), g.Requests+h.Requests, g.Errors+h.Errors, w.Refused, fmtMs(w.CPUMs),
		w.LoadStart, w.LoadEnd)
}
