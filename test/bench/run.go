package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"
)

// runner runs the benchmark's measurements on one host.
type runner struct {
	o   options
	h   *host
	bin string // phasegate
	// serialBin is the serial baseline's program, built when the dead part
	// runs it.
	serialBin string
	log       io.Writer
	res       *Results
	part      *Part // the part being measured

	mu    sync.Mutex
	procs []func() // ends a child process still running; see track
}

// run measures the parts the options ask for and returns the results,
// merged into prev when it is given. The host is swept and every child
// process ended on every return path, including cancellation.
func run(ctx context.Context, o options, prev *Results, log io.Writer) (res *Results, err error) {
	slots := max(slices.Max(o.ns), o.loadN, 2*o.acquireN, o.upLeases, o.slotRateN, o.cniCalls, o.cniGC) + spareSlots
	h, err := newHost(slots, o.cidr, o.stateParent)
	if err != nil {
		return nil, err
	}
	res = prev
	if res == nil {
		res = &Results{}
	}
	res.Machine = describeMachine(h.stateDir)
	if res.Parts == nil {
		res.Parts = map[string]*Part{}
	}
	r := &runner{o: o, h: h, log: log, res: res}
	defer func() {
		r.endProcesses()
		if serr := h.sweep(); serr != nil {
			err = errors.Join(err, fmt.Errorf("sweep of prefix %q: %w", h.cfg.Prefix, serr))
		}
		if res != nil {
			res.evaluate()
		}
	}()
	fmt.Fprintf(log, "bench: prefix %s, netns dir %s, state dir %s (%s), load average %.2f\n",
		h.cfg.Prefix, h.cfg.NetnsDir, h.stateDir, res.Machine.StateFS, loadAvg())

	// The commit the parts ran is the one built now; a -binary given is
	// no commit of this checkout's.
	commit := ""
	r.bin = o.binary
	if r.bin == "" {
		commit = gitRevision()
		fmt.Fprintln(log, "bench: building ./cmd/phasegate")
		if r.bin, err = buildPhasegate(ctx, h.base); err != nil {
			return nil, err
		}
	}
	if o.has(partDead) && o.serialReps > 0 {
		fmt.Fprintln(log, "bench: building ./bench/serialbaseline")
		if r.serialBin, err = buildSerialBaseline(ctx, h.base); err != nil {
			return nil, err
		}
	}
	measure := map[string]func(context.Context) error{
		partDead:     r.measureDead,
		partRestore:  r.measureRestore,
		partLoad:     r.measureLoad,
		partAcquire:  r.measureAcquire,
		partSlotRate: r.measureSlotRate,
		partUpgrade:  r.measureUpgrade,
		partFlood:    r.measureFlood,
		partCNI:      r.measureCNI,
		partAB:       r.measureAB,
		partDecom:    r.measureDecom,
		partFirst:    r.measureFirst,
	}
	for _, part := range o.parts {
		res.dropPart(part)
		r.part = &Part{
			Started: time.Now(), Command: commandLine(o.args), Commit: commit,
			Settings: Settings{
				Ns: o.ns, Reps: o.reps, SerialReps: o.serialReps, SerialMax: o.serialMax,
				LeaseClients: o.leaseClients, Workers: o.workers, PoolSize: o.poolSize,
				SlotIndices: h.cfg.Slots, SettleMs: ms(o.settle),
			},
		}
		r.part.Load.sample()
		res.Parts[part] = r.part
		r.logf("part %s", part)
		err := measure[part](ctx)
		r.part.Load.sample()
		r.part.Finished = time.Now()
		if err != nil {
			r.part.Incomplete = oneLine(err)
			return res, fmt.Errorf("part %s: %w", part, err)
		}
	}
	return res, nil
}

// sampleLoad folds the machine's load average into the part's.
func (r *runner) sampleLoad() { r.part.Load.sample() }

// track registers the end of a child process, so that every return path
// of run ends the ones still running.
func (r *runner) track(kill func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.procs = append(r.procs, kill)
}

// endProcesses ends every child process still running.
func (r *runner) endProcesses() {
	r.mu.Lock()
	procs := r.procs
	r.procs = nil
	r.mu.Unlock()
	for _, kill := range procs {
		kill()
	}
}

// start starts bin with args (and a held socket, if any) and tracks it.
func (r *runner) start(bin string, args []string, held *heldSocket) (*daemon, error) {
	var f = held.file()
	d, err := startDaemon(bin, args, f)
	if err != nil {
		return nil, err
	}
	r.track(d.kill)
	return d, nil
}

// maxStartAttempts is how many times a start is tried: a daemon that exits
// during its start is started again, as a supervisor would
// (Restart=on-failure; 5 is systemd's default StartLimitBurst), and the
// failure is counted, not fatal.
const maxStartAttempts = 5

// errNoStart is wrapped by startServing's error when every attempt exited
// during its start.
var errNoStart = errors.New("the daemon exited during every start")

// startServing starts a phasegate daemon and waits until it serves, starting
// it again when it exits during its start. The times are from the first
// exec; the failures say why the earlier attempts exited.
func (r *runner) startServing(ctx context.Context, args []string, held *heldSocket, timeout time.Duration) (*daemon, startup, []string, error) {
	return r.startServingBin(ctx, r.bin, args, held, timeout)
}

// startServingBin is startServing with another program than phasegate
// (the serial baseline) that serves the same health endpoints.
func (r *runner) startServingBin(ctx context.Context, bin string, args []string, held *heldSocket, timeout time.Duration) (*daemon, startup, []string, error) {
	var (
		first    startup // of the first attempt: its exec, its first answers
		failures []string
	)
	for attempt := 1; ; attempt++ {
		d, err := r.start(bin, args, held)
		if err != nil {
			return nil, startup{}, failures, err
		}
		su, err := d.measureStartup(ctx, timeout)
		if attempt == 1 {
			first = su
		}
		if err == nil {
			// The port answered from the first attempt on, if that
			// attempt got as far; SERVING is this attempt's.
			shift := d.began.Sub(first.Exec)
			su.Serving += shift
			if attempt > 1 {
				if first.FirstStatus != 0 {
					su.FirstAnswer, su.FirstStatus = first.FirstAnswer, first.FirstStatus
				} else {
					su.FirstAnswer += shift
				}
				if first.FirstGRPCSt != "" {
					su.FirstGRPC, su.FirstGRPCSt = first.FirstGRPC, first.FirstGRPCSt
				} else {
					su.FirstGRPC += shift
				}
			}
			su.Exec = first.Exec
			return d, su, failures, nil
		}
		if !d.exited() || ctx.Err() != nil {
			d.kill()
			return d, su, failures, err
		}
		why := d.lastLine()
		failures = append(failures, why)
		if attempt == maxStartAttempts {
			return d, su, failures, fmt.Errorf("%w (%d attempts; last: %s)", errNoStart, attempt, why)
		}
		r.logf("phasegate exited during its start (%s); starting it again", why)
	}
}

// logf prints a progress line with the time.
func (r *runner) logf(format string, args ...any) {
	fmt.Fprintf(r.log, "%s  %s\n", time.Now().Format(time.TimeOnly), fmt.Sprintf(format, args...))
}

// leak makes n dead slots, then pauses for -settle: the kernel's
// background work after making thousands of namespaces (RCU callbacks,
// address configuration) would otherwise slow the next exec.
func (r *runner) leak(ctx context.Context, n int) error {
	if n == 0 {
		return nil
	}
	t0 := time.Now()
	if err := r.h.leak(ctx, n); err != nil {
		return err
	}
	r.logf("leaked %d slots in %s", n, fmtMs(ms(time.Since(t0))))
	return sleep(ctx, r.o.settle)
}

// reset removes every slot a daemon kept (leased and warm, recorded) with
// `phasegate decommission --destroy-leased-slots`, then waits until
// nothing with our prefix is left and pauses for -settle.
func (r *runner) reset(ctx context.Context) error { return r.resetOn(ctx, r.bin, r.h) }

// resetOn is reset on h with the decommission of bin: the build whose
// daemon kept the slots, which reads its own records.
//
// A decommission that fails is run again, up to decommissionAttempts
// times a second apart: on a host where others make and remove thousands
// of addresses, its reads of the host's addresses can be interrupted on
// every try for the seconds it allows them.
func (r *runner) resetOn(ctx context.Context, bin string, h *host) error {
	args := append([]string{"decommission", "--destroy-leased-slots", "--log-format=json"}, slotArgs(h, r.o)...)
	for attempt := 1; ; attempt++ {
		out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
		if err == nil {
			break
		}
		if attempt == decommissionAttempts || ctx.Err() != nil {
			return fmt.Errorf("phasegate decommission (%d attempts): %w\n%s", attempt, err, out)
		}
		r.logf("phasegate decommission failed (%s); again in a second", lastLine(out))
		if err := sleep(ctx, time.Second); err != nil {
			return err
		}
	}
	return h.settle(ctx, r.o.settle)
}

// decommissionAttempts bounds resetOn's tries.
const decommissionAttempts = 5

// lastLine is the last non-empty line of a program's output.
func lastLine(out []byte) string {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return lines[len(lines)-1]
}

// startTimeout bounds a start: generous, for a machine shared with other
// namespace-heavy work (the kernel's namespace clean-up is one worker for
// everybody) and for the serial baseline's ~54 ms per slot.
func startTimeout(n int, mode string) time.Duration {
	if mode == modeSerial {
		return 2*time.Minute + time.Duration(n)*200*time.Millisecond
	}
	return 2*time.Minute + time.Duration(n)*50*time.Millisecond
}

// phaseSpans converts the lifecycle view's phases and tasks to offsets from
// began.
func phaseSpans(v lifecycleView, began time.Time) []PhaseSpan {
	spans := make([]PhaseSpan, 0, len(v.Phases)+len(v.Tasks))
	add := func(p phaseView, task bool) {
		s := PhaseSpan{Name: p.Name, State: p.State, Task: task}
		if !p.Started.IsZero() {
			s.StartMs = ms(p.Started.Sub(began))
		}
		if !p.Ended.IsZero() {
			s.EndMs = ms(p.Ended.Sub(began))
		}
		spans = append(spans, s)
	}
	for _, p := range v.Phases {
		add(p, false)
	}
	for _, t := range v.Tasks {
		add(t, true)
	}
	return spans
}
