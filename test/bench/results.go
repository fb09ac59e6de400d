package main

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Strategy names in the results.
const (
	stratPhasegate = "phasegate"
	stratSerial    = "serial"
	stratFloor     = "floor"
)

// Results is everything one benchmark run measured; it is written as
// results.json.
type Results struct {
	Started    time.Time   `json:"started"`
	Finished   time.Time   `json:"finished"`
	Command    string      `json:"command"`
	Commit     string      `json:"commit,omitempty"`
	Machine    Machine     `json:"machine"`
	Settings   Settings    `json:"settings"`
	Strategies []string    `json:"strategies"`
	Points     []*Point    `json:"points"`
	Load       *LoadResult `json:"load,omitempty"`
	Breakdowns []Breakdown `json:"reclaimBreakdowns,omitempty"`
	Goals      []Goal      `json:"goals"`
	Notes      []string    `json:"notes,omitempty"`
}

// Machine describes where the benchmark ran.
type Machine struct {
	NumCPU      int     `json:"numCPU"`
	CPU         string  `json:"cpu"`
	Kernel      string  `json:"kernel"`
	Go          string  `json:"go"`
	MemTotalMiB int     `json:"memTotalMiB"`
	LoadStart   float64 `json:"loadavg1Start"`
	LoadEnd     float64 `json:"loadavg1End"`
	LoadMin     float64 `json:"loadavg1Min"`
	LoadMax     float64 `json:"loadavg1Max"`
}

// Settings are the options the run used.
type Settings struct {
	Ns          []int   `json:"ns"`
	Skipped10k  bool    `json:"skipped10k"`
	Reps        int     `json:"reps"`
	SerialReps  int     `json:"serialReps"`
	SerialMax   int     `json:"serialMax"`
	LoadN       int     `json:"loadN"`
	LoadReps    int     `json:"loadReps"`
	Rate        int     `json:"ratePerS"`
	Workers     int     `json:"workers"`
	PoolSize    int     `json:"poolSize"`
	SlotIndices int     `json:"slotIndices"`
	SettleMs    float64 `json:"settleMs"`
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

	FirstAnswerMs Summary `json:"firstAnswerMs"`
	FirstGRPCMs   Summary `json:"firstGrpcMs"`
	ServingMs     Summary `json:"servingMs"`
	ReclaimMs     Summary `json:"reclaimMs"`
	RatePerS      Summary `json:"reclaimRatePerS"`
	RSSMiB        Summary `json:"rssMiB"`
	HWMMiB        Summary `json:"peakRssMiB"`
}

// Run is one measured start (phasegate, serial) or one floor removal.
type Run struct {
	FirstAnswerMs float64     `json:"firstAnswerMs,omitempty"`
	FirstStatus   int         `json:"firstStatus,omitempty"`
	FirstGRPCMs   float64     `json:"firstGrpcMs,omitempty"`
	FirstGRPC     string      `json:"firstGrpcStatus,omitempty"`
	ServingMs     float64     `json:"servingMs"`
	ReclaimMs     float64     `json:"reclaimMs"`
	Reclaimed     int         `json:"reclaimed"`
	CutOff        int         `json:"cutOff,omitempty"`
	RatePerS      float64     `json:"reclaimRatePerS,omitempty"`
	RSSMiB        float64     `json:"rssMiB,omitempty"`
	HWMMiB        float64     `json:"peakRssMiB,omitempty"`
	UnlinkMs      float64     `json:"unlinkMs,omitempty"`
	FirewallMs    float64     `json:"firewallMs,omitempty"`
	Phases        []PhaseSpan `json:"phases,omitempty"`
}

// PhaseSpan is one phase of a start, in ms from the exec.
type PhaseSpan struct {
	Name    string  `json:"name"`
	State   string  `json:"state"`
	StartMs float64 `json:"startMs"`
	EndMs   float64 `json:"endMs"`
}

// Extrapolation estimates a skipped serial point from measured ones.
type Extrapolation struct {
	FirstAnswerMs float64 `json:"firstAnswerMs"`
	ServingMs     float64 `json:"servingMs"`
	Basis         string  `json:"basis"`
}

// LoadResult is the latency of health checks from a separate load
// generator, while the daemon reclaims and while it is idle.
type LoadResult struct {
	N        int                     `json:"n"`
	Rate     int                     `json:"ratePerS"`
	Reps     int                     `json:"reps"`
	WindowMs []float64               `json:"reclaimWindowsMs"`
	Reclaim  map[string]LatencyStats `json:"duringReclaim"`
	Idle     map[string]LatencyStats `json:"idle"`
}

// LatencyStats summarizes one kind of request.
type LatencyStats struct {
	Requests   int     `json:"requests"`
	Errors     int     `json:"errors"`
	P50Ms      float64 `json:"p50Ms"`
	P99Ms      float64 `json:"p99Ms"`
	MaxMs      float64 `json:"maxMs"`
	FirstError string  `json:"firstError,omitempty"`
}

// Goal is one of the goals and whether this run met it.
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
	for _, p := range r.Points {
		if p.Strategy == strategy && p.N == n {
			return p
		}
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

// summarizeRuns fills the point's summaries from its runs.
func (p *Point) summarizeRuns() {
	pick := func(f func(Run) float64) Summary {
		var xs []float64
		for _, r := range p.Runs {
			xs = append(xs, f(r))
		}
		return summarize(xs)
	}
	p.FirstAnswerMs = pick(func(r Run) float64 { return r.FirstAnswerMs })
	p.FirstGRPCMs = pick(func(r Run) float64 { return r.FirstGRPCMs })
	p.ServingMs = pick(func(r Run) float64 { return r.ServingMs })
	p.ReclaimMs = pick(func(r Run) float64 { return r.ReclaimMs })
	p.RatePerS = pick(func(r Run) float64 { return r.RatePerS })
	p.RSSMiB = pick(func(r Run) float64 { return r.RSSMiB })
	p.HWMMiB = pick(func(r Run) float64 { return r.HWMMiB })
}

// measured reports whether the point has runs.
func (p *Point) measured() bool { return p != nil && len(p.Runs) > 0 }

// describeMachine reads the machine's facts.
func describeMachine() Machine {
	m := Machine{NumCPU: runtime.NumCPU(), Go: runtime.Version()}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		m.Kernel = unix.ByteSliceToString(u.Release[:])
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) == nil {
		m.MemTotalMiB = int(uint64(si.Totalram) * uint64(si.Unit) >> 20)
	}
	m.LoadStart = loadAvg()
	m.LoadMin, m.LoadMax = m.LoadStart, m.LoadStart
	return m
}

// sampleLoad folds the current 1-minute load average into min/max.
func (m *Machine) sampleLoad() {
	l := loadAvg()
	m.LoadMin, m.LoadMax = min(m.LoadMin, l), max(m.LoadMax, l)
	m.LoadEnd = l
}

// loadAvg returns the 1-minute load average.
func loadAvg() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

// commandLine renders how this run was started, for the report.
func commandLine(args []string) string {
	q := make([]string, 0, len(args))
	for _, a := range args {
		if strings.ContainsAny(a, " \t'\"$") {
			a = strconv.Quote(a)
		}
		q = append(q, a)
	}
	return strings.TrimSpace("sudo go run ./test/bench " + strings.Join(q, " "))
}

// gitRevision returns the checkout's short commit, or "".
func gitRevision() string {
	out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
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
