package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// measureFirst times exec → the first answer to GET /health of phasegate
// (`serve` on its bench settings, with N dead slots at each N of -n up to
// firstMaxN) beside the least a Go program does to give one: trivialhttp,
// built by the benchmark (issue 48, item 1: ≤ 1.3× it). The runs take
// turns, rep by rep, so that the machine's load meets all alike; the same
// poller (a new connection every millisecond) times each. Beside them, the
// package initialisation each binary runs before its main
// (GODEBUG=inittrace=1, medians of -reps runs): when it ends, after the
// runtime's start, and its clock time summed. The
// figures go to the log as a table.
func (r *runner) measureFirst(ctx context.Context) error {
	trivial, err := build(ctx, r.h.base, "trivialhttp", "github.com/phasegate/phasegate/test/bench/trivialhttp")
	if err != nil {
		return err
	}
	var rows []firstRow
	base := firstRow{name: "trivialhttp (net/http, one handler)"}
	for _, n := range r.o.ns {
		if n > firstMaxN {
			continue
		}
		row := firstRow{name: fmt.Sprintf("phasegate serve, %d dead slots", n)}
		for rep := range r.o.reps {
			r.sampleLoad()
			t, err := firstOfTrivial(ctx, trivial)
			if err != nil {
				return fmt.Errorf("trivialhttp: %w", err)
			}
			base.answers = append(base.answers, t)
			p, err := r.firstOfPhasegate(ctx, n)
			if err != nil {
				return fmt.Errorf("N=%d: %w", n, err)
			}
			row.answers = append(row.answers, p)
			r.logf("N=%d rep %d: first answer trivialhttp %s, phasegate %s, load average %.2f", n, rep+1, fmtMs(ms(t)), fmtMs(ms(p)), loadAvg())
		}
		rows = append(rows, row)
	}
	for _, b := range []struct {
		row  *firstRow
		bin  string
		args []string
	}{{&base, trivial, []string{"127.0.0.1:0"}}, {&rows[0], r.bin, []string{"version"}}} {
		if b.row.inits, err = initTraces(ctx, b.bin, b.args, r.o.reps); err != nil {
			return err
		}
	}
	for k := range rows {
		rows[k].inits = rows[0].inits
	}
	r.logf("exec → first /health answer, median [min–max] (trivialhttp: every run, beside each N), and the package inits before main (medians of %d):\n%s", r.o.reps, firstTable(base, rows))
	return nil
}

// firstMaxN is the largest N of dead slots the part starts phasegate on:
// the goal is at 0 and 5,000.
const firstMaxN = 5000

// firstRow is one program's first answers and its inits.
type firstRow struct {
	name    string
	answers []time.Duration
	inits   inits
}

// firstOfTrivial starts the baseline on a free port and times exec → its
// first answer.
func firstOfTrivial(ctx context.Context, bin string) (time.Duration, error) {
	addr, err := freeAddr()
	if err != nil {
		return 0, err
	}
	cmd := exec.Command(bin, addr)
	began := time.Now()
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, at, err := firstHTTPAnswer(ctx, addr, nil)
	return at.Sub(began), err
}

// firstOfPhasegate leaks n dead slots, starts the daemon on them (the
// background reclaim, its default) and times exec → its first answer; then
// it stops the daemon and removes what it kept.
func (r *runner) firstOfPhasegate(ctx context.Context, n int) (time.Duration, error) {
	if err := r.leak(ctx, n); err != nil {
		return 0, err
	}
	addr, err := freeAddr()
	if err != nil {
		return 0, err
	}
	d, su, _, err := r.startServingBin(ctx, r.bin, daemonArgs(r.h, addr, r.o, modeBackground, r.o.poolSize), nil, startTimeout(n, modeBackground))
	if err != nil {
		return 0, err
	}
	if _, err := d.stop(); err != nil {
		return 0, err
	}
	return su.FirstAnswer, r.reset(ctx)
}

// inits is what GODEBUG=inittrace=1 says of a binary's package
// initialisation: how many packages, when the last one ended after the
// runtime started, and their clock time summed.
type inits struct {
	packages int
	end, sum time.Duration
}

// initTraces is initTrace run n times, the median of each figure.
func initTraces(ctx context.Context, bin string, args []string, n int) (inits, error) {
	var ends, sums []float64
	var in inits
	for range max(n, 1) {
		one, err := initTrace(ctx, bin, args)
		if err != nil {
			return in, err
		}
		in.packages = one.packages
		ends, sums = append(ends, ms(one.end)), append(sums, ms(one.sum))
	}
	in.end = time.Duration(summarize(ends).Median * float64(time.Millisecond))
	in.sum = time.Duration(summarize(sums).Median * float64(time.Millisecond))
	return in, nil
}

// initLine is one line of GODEBUG=inittrace=1: "init PKG @START ms, CLOCK
// ms clock, …".
var initLine = regexp.MustCompile(`^init (\S+) @([0-9.]+) ms, ([0-9.]+) ms clock`)

// initTrace runs bin with args under GODEBUG=inittrace=1 and reads its
// inits; the program is killed after a second if it has not exited (a
// server), which is long after its inits.
func initTrace(ctx context.Context, bin string, args []string) (inits, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), "GODEBUG=inittrace=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	_ = cmd.Run() // a server is killed: its inits are what is read
	var in inits
	sc := bufio.NewScanner(&stderr)
	for sc.Scan() {
		m := initLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		at, _ := strconv.ParseFloat(m[2], 64)
		clock, _ := strconv.ParseFloat(m[3], 64)
		in.packages++
		in.sum += time.Duration(clock * float64(time.Millisecond))
		in.end = max(in.end, time.Duration((at+clock)*float64(time.Millisecond)))
	}
	if in.packages == 0 {
		return in, fmt.Errorf("%s: no inittrace lines in its stderr:\n%.2000s", bin, stderr.String())
	}
	return in, nil
}

// firstTable is the part's figures as a Markdown table.
func firstTable(base firstRow, rows []firstRow) string {
	var b strings.Builder
	b.WriteString("| program | first answer | / trivialhttp | packages initialised | inits end (after the runtime's start) | inits' clock time |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|\n")
	bs := summarize(msOf(base.answers))
	for _, row := range append([]firstRow{base}, rows...) {
		s := summarize(msOf(row.answers))
		fmt.Fprintf(&b, "| %s | %s | %.2f× | %d | %s | %s |\n", row.name, fmtSummary(s), s.Median/bs.Median,
			row.inits.packages, fmtMs(ms(row.inits.end)), fmtMs(ms(row.inits.sum)))
	}
	return b.String()
}
