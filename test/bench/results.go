package main

import (
	"fmt"
	"slices"
	"time"
)

// Strategies (Point.Strategy). The first four are the dead-slot part's, the
// rest the restore part's: its plain variant and its guest+policy one.
const (
	stratBackground  = "background"   // phasegate's default: dead reclaimed after SERVING
	stratForeground  = "foreground"   // --reclaim=foreground: the start before live restore
	stratSerial      = "serial"       // ./serialbaseline: E2B's orchestrator's start
	stratFloor       = "floor"        // no daemon: detach+unlink, wait for the veths
	stratRestoreTerm = "restore-term" // N leases, SIGTERM, start again
	stratRestoreKill = "restore-kill" // N leases, kill -9, start again
	// The same with the guest profile (--slot-guest-*) and every lease
	// with an egress policy.
	stratGuestTerm = "restore-guest-term"
	stratGuestKill = "restore-guest-kill"
	// The same with every lease holding a published port and bandwidth
	// limits each way (and its counters, which every lease has).
	stratDatapathTerm = "restore-datapath-term"
	stratDatapathKill = "restore-datapath-kill"
)

var deadStrategies = []string{stratBackground, stratForeground, stratSerial, stratFloor}

var restoreStrategies = []string{stratRestoreTerm, stratRestoreKill}

var guestStrategies = []string{stratGuestTerm, stratGuestKill}

var datapathStrategies = []string{stratDatapathTerm, stratDatapathKill}

// plainOf is each variant's restore strategy's plain counterpart: the
// same restart of slots without the variant's profile.
var plainOf = map[string]string{
	stratGuestTerm: stratRestoreTerm, stratGuestKill: stratRestoreKill,
	stratDatapathTerm: stratRestoreTerm, stratDatapathKill: stratRestoreKill,
}

// allRestoreStrategies are the restore part's, every variant.
var allRestoreStrategies = slices.Concat(restoreStrategies, guestStrategies, datapathStrategies)

// restartName names a restore strategy's restart for the report.
func restartName(strategy string) string {
	return map[string]string{
		stratRestoreTerm: "SIGTERM", stratRestoreKill: "kill -9",
		stratGuestTerm: "guest+policy, SIGTERM", stratGuestKill: "guest+policy, kill -9",
		stratDatapathTerm: "ports+limits, SIGTERM", stratDatapathKill: "ports+limits, kill -9",
	}[strategy]
}

// Results is everything the benchmark measured; it is written as
// results.json. Parts measured in different runs (-merge) each say when
// and how they were measured.
type Results struct {
	Machine Machine          `json:"machine"`
	Parts   map[string]*Part `json:"parts"`
	Points  []*Point         `json:"points"`
	Leasing []LeaseSetup     `json:"leasing,omitempty"`
	// ExecMs is exec → exit of `phasegate version`, once per rep of the
	// dead part: what starting the binary costs before it does anything.
	ExecMs     []float64       `json:"execVersionMs,omitempty"`
	Breakdowns []Breakdown     `json:"reclaimBreakdowns,omitempty"`
	Load       *LoadResult     `json:"load,omitempty"`
	Acquire    *AcquireResult  `json:"acquire,omitempty"`
	SlotRate   *SlotRateResult `json:"slotRate,omitempty"`
	CNI        *CNIResult      `json:"cni,omitempty"`
	Upgrade    *UpgradeResult  `json:"upgrade,omitempty"`
	Flood      *FloodResult    `json:"flood,omitempty"`
	AB         *ABResult       `json:"ab,omitempty"`
	Goals      []Goal          `json:"goals"`
	Notes      []string        `json:"notes,omitempty"`
}

// Machine describes where the benchmark ran.
type Machine struct {
	NumCPU      int    `json:"numCPU"`
	CPU         string `json:"cpu"`
	Kernel      string `json:"kernel"`
	Go          string `json:"go"`
	MemTotalMiB int    `json:"memTotalMiB"`
	// StateFS is the file system type of the daemon's --state-dir.
	StateFS string `json:"stateFS"`
}

// Part is when and how one part was measured.
type Part struct {
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished"`
	Command  string    `json:"command"`
	Commit   string    `json:"commit,omitempty"`
	Settings Settings  `json:"settings"`
	// Load is the 1-minute load average while the part ran.
	Load LoadAvg `json:"loadavg1"`
	// Incomplete says why the part stopped before its end, if it did.
	Incomplete string `json:"incomplete,omitempty"`
}

// LoadAvg is the 1-minute load average at the start and end of a part and
// its extremes, sampled between runs.
type LoadAvg struct {
	Start float64 `json:"start"`
	End   float64 `json:"end"`
	Min   float64 `json:"min"`
	Max   float64 `json:"max"`
}

// sample folds the current load average in.
func (l *LoadAvg) sample() {
	v := loadAvg()
	if l.Start == 0 && l.Min == 0 && l.Max == 0 {
		l.Start, l.Min, l.Max = v, v, v
	}
	l.Min, l.Max, l.End = min(l.Min, v), max(l.Max, v), v
}

// Settings are the options a part ran with.
type Settings struct {
	Ns           []int   `json:"ns"`
	Reps         int     `json:"reps"`
	SerialReps   int     `json:"serialReps"`
	SerialMax    int     `json:"serialMax"`
	LeaseClients int     `json:"leaseClients"`
	Workers      int     `json:"workers"`
	PoolSize     int     `json:"poolSize"`
	SlotIndices  int     `json:"slotIndices"`
	SettleMs     float64 `json:"settleMs"`
	// GuestFlags are the daemon's flags in the restore part's guest+policy
	// variant and GuestPolicies the policies its leases carry ("": the
	// variant did not run).
	GuestFlags    string `json:"guestFlags,omitempty"`
	GuestPolicies string `json:"guestPolicies,omitempty"`
}

// Point is one strategy at one N: its runs and their summaries.
type Point struct {
	Strategy string `json:"strategy"`
	N        int    `json:"n"`
	Runs     []Run  `json:"runs"`
	// Skipped says why the strategy did not run at this N.
	Skipped string `json:"skipped,omitempty"`
	// Extrapolated is an estimate for a skipped serial point, never a
	// measurement.
	Extrapolated *Extrapolation `json:"extrapolated,omitempty"`

	FirstAnswerMs  Summary `json:"firstAnswerMs"`
	FirstGRPCMs    Summary `json:"firstGrpcMs"`
	ServingMs      Summary `json:"servingMs"`
	DeadGoneMs     Summary `json:"deadGoneMs"`
	AfterServingMs Summary `json:"deadGoneAfterServingMs"`
	VerifiedMs     Summary `json:"verifiedMs"`
	InsideMs       Summary `json:"insideVerifiedMs"`
	ReclaimMs      Summary `json:"reclaimMs"`
	RatePerS       Summary `json:"reclaimRatePerS"`
	StopMs         Summary `json:"stopMs"`
	RSSMiB         Summary `json:"rssMiB"`
	HWMMiB         Summary `json:"peakRssMiB"`
}

// Run is one measured start (a daemon strategy) or one floor removal.
type Run struct {
	FirstAnswerMs float64 `json:"firstAnswerMs,omitempty"`
	FirstStatus   int     `json:"firstStatus,omitempty"`
	FirstGRPCMs   float64 `json:"firstGrpcMs,omitempty"`
	FirstGRPC     string  `json:"firstGrpcStatus,omitempty"`
	ServingMs     float64 `json:"servingMs"`
	// DeadGoneMs is exec → the dead slots all gone: the daemon's reclaim
	// report reaching the benchmark (the floor: its own duration).
	DeadGoneMs float64 `json:"deadGoneMs,omitempty"`
	// VerifiedMs is exec → every restored lease verified after SERVING:
	// the daemon's "restored leases verified" line reaching the benchmark.
	VerifiedMs float64 `json:"verifiedMs,omitempty"`
	// ReclaimMs is the reclaim report's own duration.
	ReclaimMs  float64     `json:"reclaimMs,omitempty"`
	Reclaimed  int         `json:"reclaimed"`
	CutOff     int         `json:"cutOff,omitempty"`
	RatePerS   float64     `json:"reclaimRatePerS,omitempty"`
	RSSMiB     float64     `json:"rssMiB,omitempty"`
	HWMMiB     float64     `json:"peakRssMiB,omitempty"`
	UnlinkMs   float64     `json:"unlinkMs,omitempty"`
	FirewallMs float64     `json:"firewallMs,omitempty"`
	Phases     []PhaseSpan `json:"phases,omitempty"`
	// ReclaimLog is the daemon's reclaim lines as it logged them: the
	// background reclaim's pace (batches, decreases, largest batch,
	// pauses, signals over), if any, and the reclaim report (where the
	// time went).
	ReclaimLog []string `json:"reclaimLog,omitempty"`

	// The restore part: how the previous daemon ended (SIGTERM: how long
	// it took to exit), what the start's restore line and its verification
	// of the leases after SERVING say (restored: verified intact; lost:
	// by either), and what the benchmark checked itself.
	StopMs   float64 `json:"stopMs,omitempty"`
	Restored int     `json:"restored,omitempty"`
	Adopted  int     `json:"adopted,omitempty"`
	Dead     int     `json:"deadFound,omitempty"`
	Lost     int     `json:"lost,omitempty"`
	// Destroyed counts leased slots whose netns inode or host veth
	// ifindex changed or vanished across the restart.
	Destroyed int `json:"destroyed"`
	// Listed counts the slots the API lists ACQUIRED by the leases' owner.
	Listed int `json:"listed,omitempty"`
	// FailedStarts says why a start failed before the one measured (the
	// daemon exited and was started again; the times include it).
	FailedStarts []string `json:"failedStarts,omitempty"`
	// NoStart: every start attempt failed; the run has no times.
	NoStart bool `json:"noStart,omitempty"`

	// The guest+policy variant, after its lease verification: exec → the
	// background check of the slots' insides (verify-inside) done, and
	// what it repaired; the leases whose policy List shows as it was
	// acquired (PoliciesKept of PoliciesChecked); the sampled namespaces
	// whose tables, rules and tap are the same kernel objects as before
	// the restarts (InsideKept of InsideSampled).
	InsideVerifiedMs float64 `json:"insideVerifiedMs,omitempty"`
	InsideRepaired   int     `json:"insideRepaired,omitempty"`
	PoliciesChecked  int     `json:"policiesChecked,omitempty"`
	PoliciesKept     int     `json:"policiesKept,omitempty"`
	InsideSampled    int     `json:"insideSampled,omitempty"`
	InsideKept       int     `json:"insideKept,omitempty"`
	// PolicyDiffs are the first differences found, for the report.
	PolicyDiffs []string `json:"policyDiffs,omitempty"`
	// DatapathKept: the ports+limits variant's leases that List shows,
	// after the restart, with the port and limits they were acquired
	// with.
	DatapathKept int `json:"datapathKept,omitempty"`
}

// PhaseSpan is one phase (or background task) of a start, in ms from the
// exec.
type PhaseSpan struct {
	Name    string  `json:"name"`
	State   string  `json:"state"`
	Task    bool    `json:"task,omitempty"`
	StartMs float64 `json:"startMs"`
	EndMs   float64 `json:"endMs"`
}

// Extrapolation estimates a skipped serial point from measured ones.
type Extrapolation struct {
	FirstAnswerMs float64 `json:"firstAnswerMs"`
	ServingMs     float64 `json:"servingMs"`
	Basis         string  `json:"basis"`
}

// LeaseSetup is how the restore part leased N slots through the API.
type LeaseSetup struct {
	N int `json:"n"`
	// Guest: the guest+policy variant (slots with the guest device, each
	// Acquire with a policy).
	Guest bool `json:"guest,omitempty"`
	// Datapath: the ports+limits variant (each Acquire with a published
	// port and bandwidth limits).
	Datapath bool    `json:"datapath,omitempty"`
	Clients  int     `json:"clients"`
	Ms       float64 `json:"ms"`
	PerS     float64 `json:"perS"`
}

// LoadResult is the latency of health checks and Acquire calls from
// separate load generators after a start with dead slots to reclaim in the
// background (from SERVING to the end of the reclaim), after a start with
// none (the same length of time from SERVING), and against a daemon that
// has been serving a while, idle. Stats are pooled over the reps; Runs
// has each rep's.
//
// Health checks go at the heavy rate (Rate, half HTTP on keep-alive
// connections, half gRPC Check on one kept connection) in those windows,
// and as real checkers send them (HTTP on a new connection each, gRPC
// Check on one kept connection) at checker rates (Checker) during a
// reclaim of its own; in every reclaim window the control server (`bench control`:
// net/http and grpc-go's health server, no phasegate) is probed the same
// way at the same time, and Control is what it answered.
type LoadResult struct {
	N           int                     `json:"n"`
	Rate        int                     `json:"ratePerS"`
	AcquireRate int                     `json:"acquireRatePerS"`
	Reps        int                     `json:"reps"`
	WindowMs    []float64               `json:"reclaimWindowsMs"`
	Reclaim     map[string]LatencyStats `json:"duringReclaim"`
	Control     map[string]LatencyStats `json:"controlDuringReclaim"`
	Start       map[string]LatencyStats `json:"afterStartNothingToReclaim"`
	Idle        map[string]LatencyStats `json:"idle"`
	Runs        []LoadRun               `json:"runs"`
	Checker     *CheckerLoad            `json:"checker,omitempty"`
}

// CheckerLoad is the health checks at checker rates (HTTPRate new
// connections/s, GRPCRate Checks/s on a kept connection) during a
// background reclaim of N dead slots, the daemon's and the control
// server's, pooled over the reps.
type CheckerLoad struct {
	HTTPRate int                     `json:"httpPerS"`
	GRPCRate int                     `json:"grpcPerS"`
	WindowMs []float64               `json:"reclaimWindowsMs"`
	Reclaim  map[string]LatencyStats `json:"duringReclaim"`
	Control  map[string]LatencyStats `json:"controlDuringReclaim"`
}

// LoadRun is one rep of the load part.
type LoadRun struct {
	Reclaim map[string]LatencyStats `json:"duringReclaim"`
	Control map[string]LatencyStats `json:"controlDuringReclaim"`
	Start   map[string]LatencyStats `json:"afterStartNothingToReclaim"`
	Idle    map[string]LatencyStats `json:"idle"`
	// Times from the exec of the reclaiming daemon.
	ServingMs    float64 `json:"servingMs"`
	FillEndMs    float64 `json:"fillEndMs"`
	ReclaimEndMs float64 `json:"reclaimEndMs"`
	// ReclaimLog is the reclaiming daemon's pace and report lines (see
	// Run.ReclaimLog).
	ReclaimLog []string `json:"reclaimLog,omitempty"`
	// Series is the reclaiming start's requests in 250 ms buckets from its
	// exec.
	Series []LatencyBucket `json:"series"`
}

// LatencyBucket summarizes the requests sent in one bucket of time.
type LatencyBucket struct {
	Health     int     `json:"health"`
	HealthP50  float64 `json:"healthP50Ms"`
	HealthP99  float64 `json:"healthP99Ms"`
	HealthMax  float64 `json:"healthMaxMs"`
	Errors     int     `json:"errors,omitempty"`
	Acquires   int     `json:"acquires,omitempty"`
	AcquireMax float64 `json:"acquireMaxMs,omitempty"`
	LagMax     float64 `json:"lagMaxMs"`
}

// LatencyStats summarizes one kind of request.
type LatencyStats struct {
	Requests   int     `json:"requests"`
	Errors     int     `json:"errors"`
	P50Ms      float64 `json:"p50Ms"`
	P99Ms      float64 `json:"p99Ms"`
	MaxMs      float64 `json:"maxMs"`
	FirstError string  `json:"firstError,omitempty"`
	// Over1s counts the answers that took more than a second.
	Over1s int `json:"over1s"`
	// LagP99Ms is the 99th percentile of how late the generator sent
	// (see sample.Lag): tens of ms and more mean it was starved itself.
	LagP99Ms float64 `json:"lagP99Ms"`
}

// AcquireResult compares Acquire with the durable record (the daemon) and
// with the record in a map (the in-memory baseline, `bench memslots`).
type AcquireResult struct {
	Calls   int `json:"callsPerRep"`
	Clients int `json:"clients"`
	Reps    int `json:"reps"`
	// WarmPool is each side's pool (burstPool(Calls)); 0 in results from
	// before it held its reserve through the burst, when it was Calls and
	// both pools refilled during the last quarter of the burst.
	WarmPool int `json:"warmPool,omitempty"`
	// Durable and Memory are by side; each run is one burst of Calls.
	Durable AcquireSide `json:"durable"`
	Memory  AcquireSide `json:"memory"`
}

// AcquireSide is one side of the Acquire comparison.
type AcquireSide struct {
	Runs []AcquireRun `json:"runs"`
	// PerS is the throughput over the runs; Latency pools every call.
	PerS    Summary      `json:"callsPerS"`
	Latency LatencyStats `json:"latency"`
}

// AcquireRun is one burst of Acquire calls.
type AcquireRun struct {
	PerS   float64 `json:"callsPerS"`
	P50Ms  float64 `json:"p50Ms"`
	P99Ms  float64 `json:"p99Ms"`
	MaxMs  float64 `json:"maxMs"`
	Errors int     `json:"errors"`
}

// UpgradeResult is what new connections saw across upgrades and restarts.
type UpgradeResult struct {
	Rate      int        `json:"probesPerS"`
	Leases    int        `json:"leases"`
	Scenarios []Scenario `json:"scenarios"`
}

// Scenario is one series of upgrades or restarts under a steady stream of
// new connections.
type Scenario struct {
	Name   string `json:"name"`
	Events int    `json:"events"`
	// Probes are the connection attempts sent while the scenario ran, by
	// outcome: answered SERVING/200, answered NOT_SERVING/503, refused,
	// failed otherwise (reset, timeout, any error that is not an answer).
	Probes     int `json:"probes"`
	Serving    int `json:"serving"`
	NotServing int `json:"notServing"`
	Refused    int `json:"refused"`
	Failed     int `json:"failed"`
	// FirstError is the first failure's error (refusals are not kept).
	FirstError string `json:"firstError,omitempty"`
	// GapMs is, per event, the signal → SERVING again on a new connection.
	GapMs Summary `json:"gapMs"`
	// LatencyP99Ms and MaxMs are over the answered probes.
	LatencyP99Ms float64 `json:"latencyP99Ms"`
	LatencyMaxMs float64 `json:"latencyMaxMs"`
	// Restored is the fewest leases a start of the scenario restored, and
	// Destroyed the leased slots whose kernel identity changed.
	Restored  int `json:"restoredMin"`
	Destroyed int `json:"destroyed"`
	// FailedStarts says why a start of the scenario failed before the
	// one that served (the supervisor's restart counted in the gap).
	FailedStarts []string `json:"failedStarts,omitempty"`
	// Series is the probes in 100 ms buckets from the scenario's start.
	Series []Bucket `json:"series"`
	// EventsMs are the signals, in ms from the scenario's start.
	EventsMs []float64 `json:"eventsMs"`
}

// Bucket counts the probes sent in 100 ms.
type Bucket struct {
	Serving    int     `json:"s,omitempty"`
	NotServing int     `json:"n,omitempty"`
	Refused    int     `json:"r,omitempty"`
	Failed     int     `json:"f,omitempty"`
	MaxMs      float64 `json:"max,omitempty"`
}

// Goal is one of the goals and whether the results meet it.
type Goal struct {
	Name     string `json:"name"`
	Target   string `json:"target"`
	Measured string `json:"measured"`
	// Status is "met", "missed" or "not measured".
	Status string `json:"status"`
	Note   string `json:"note,omitempty"`
}

// point returns the results' point for strategy and n, adding it if new.
func (r *Results) point(strategy string, n int) *Point {
	if p := r.find(strategy, n); p != nil {
		return p
	}
	p := &Point{Strategy: strategy, N: n}
	r.Points = append(r.Points, p)
	return p
}

// find returns the point for strategy and n, or nil.
func (r *Results) find(strategy string, n int) *Point {
	for _, p := range r.Points {
		if p.Strategy == strategy && p.N == n {
			return p
		}
	}
	return nil
}

// ns returns the Ns that points of the given strategies have, ascending.
func (r *Results) ns(strategies []string) []int {
	var out []int
	for _, p := range r.Points {
		if slices.Contains(strategies, p.Strategy) && !slices.Contains(out, p.N) {
			out = append(out, p.N)
		}
	}
	slices.Sort(out)
	return out
}

// dropPart removes what a part measured, before it is measured again.
func (r *Results) dropPart(part string) {
	switch part {
	case partDead:
		r.Points = slices.DeleteFunc(r.Points, func(p *Point) bool { return slices.Contains(deadStrategies, p.Strategy) })
		r.Breakdowns, r.ExecMs = nil, nil
	case partRestore:
		r.Points = slices.DeleteFunc(r.Points, func(p *Point) bool { return slices.Contains(allRestoreStrategies, p.Strategy) })
		r.Leasing = nil
	case partLoad:
		r.Load = nil
	case partAcquire:
		r.Acquire = nil
	case partSlotRate:
		r.SlotRate = nil
	case partUpgrade:
		r.Upgrade = nil
	case partFlood:
		r.Flood = nil
	case partCNI:
		r.CNI = nil
	case partAB:
		r.AB = nil
	}
	delete(r.Parts, part)
}

// evaluate summarizes every point and (re)computes goals and notes.
func (r *Results) evaluate() {
	for _, p := range r.Points {
		p.summarizeRuns()
	}
	r.Goals = evaluateGoals(r)
	r.Notes = notes(r)
}

// summarizeRuns fills the point's summaries from its runs.
func (p *Point) summarizeRuns() {
	pick := func(f func(Run) float64) Summary {
		var xs []float64
		for _, r := range p.Runs {
			if !r.NoStart {
				xs = append(xs, f(r))
			}
		}
		return summarize(xs)
	}
	p.FirstAnswerMs = pick(func(r Run) float64 { return r.FirstAnswerMs })
	p.FirstGRPCMs = pick(func(r Run) float64 { return r.FirstGRPCMs })
	p.ServingMs = pick(func(r Run) float64 { return r.ServingMs })
	p.DeadGoneMs = pick(func(r Run) float64 { return r.DeadGoneMs })
	p.AfterServingMs = pick(func(r Run) float64 { return max(r.DeadGoneMs-r.ServingMs, 0) })
	p.VerifiedMs = pick(func(r Run) float64 { return r.VerifiedMs })
	p.InsideMs = pick(func(r Run) float64 { return r.InsideVerifiedMs })
	p.ReclaimMs = pick(func(r Run) float64 { return r.ReclaimMs })
	p.RatePerS = pick(func(r Run) float64 { return r.RatePerS })
	p.StopMs = pick(func(r Run) float64 { return r.StopMs })
	p.RSSMiB = pick(func(r Run) float64 { return r.RSSMiB })
	p.HWMMiB = pick(func(r Run) float64 { return r.HWMMiB })
}

// measured reports whether the point has runs with times.
func (p *Point) measured() bool {
	return p != nil && slices.ContainsFunc(p.Runs, func(r Run) bool { return !r.NoStart })
}

// noStarts counts the point's runs in which the daemon never served.
func (p *Point) noStarts() int {
	n := 0
	for _, r := range p.Runs {
		if r.NoStart {
			n++
		}
	}
	return n
}

// fmtMs formats milliseconds compactly: 0.84 ms, 12.3 ms, 1.92 s, 4.5 min.
func fmtMs(v float64) string {
	switch {
	case v >= 120_000:
		return fmt.Sprintf("%.1f min", v/60_000)
	case v >= 10_000:
		return fmt.Sprintf("%.1f s", v/1000)
	case v >= 1000:
		return fmt.Sprintf("%.2f s", v/1000)
	case v >= 100:
		return fmt.Sprintf("%.0f ms", v)
	case v >= 10:
		return fmt.Sprintf("%.1f ms", v)
	default:
		return fmt.Sprintf("%.2f ms", v)
	}
}

// fmtSummary formats a summary as "median [min–max]" (the spread only with
// more than one value).
func fmtSummary(s Summary) string {
	if s.Count == 0 {
		return "—"
	}
	if s.Count == 1 {
		return fmtMs(s.Median)
	}
	return fmt.Sprintf("%s [%s–%s]", fmtMs(s.Median), fmtMs(s.Min), fmtMs(s.Max))
}
