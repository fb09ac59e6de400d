package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
)

// Markers delimiting the generated section of the -doc file.
const (
	docStart = "<!-- bench:start -->"
	docEnd   = "<!-- bench:end -->"
)

// writeOutputs writes results.json, the plots and report.md to o.out and
// updates o.doc's generated section.
func writeOutputs(res *Results, o options) error {
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return fmt.Errorf("output dir: %w", err)
	}
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(o.out, "results.json"), append(b, '\n'), 0o644); err != nil {
		return err
	}
	if err := writePlots(res, o.out); err != nil {
		return fmt.Errorf("plots: %w", err)
	}
	if err := os.WriteFile(filepath.Join(o.out, "report.md"), []byte(markdown(res, "")), 0o644); err != nil {
		return err
	}
	if o.doc == "" {
		return nil
	}
	rel, err := filepath.Rel(filepath.Dir(o.doc), o.out)
	if err != nil {
		return fmt.Errorf("-doc: %w", err)
	}
	return replaceSection(o.doc, markdown(res, filepath.ToSlash(rel)+"/"))
}

// replaceSection replaces what lies between the markers in file.
func replaceSection(file, body string) error {
	b, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("-doc: %w", err)
	}
	s := string(b)
	i, j := strings.Index(s, docStart), strings.Index(s, docEnd)
	if i < 0 || j < i {
		return fmt.Errorf("-doc %s: no %s … %s section", file, docStart, docEnd)
	}
	out := s[:i+len(docStart)] + "\n" + body + s[j:]
	return os.WriteFile(file, []byte(out), 0o644)
}

// printTable writes the human-readable summary.
func printTable(w io.Writer, res *Results) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "N\tstrategy\truns\tfirst HTTP answer\tfirst gRPC answer\tSERVING\treclaim\tslots/s\tRSS MiB")
	for _, n := range res.Settings.Ns {
		for _, s := range res.Strategies {
			p := res.find(s, n)
			if p == nil {
				continue
			}
			if !p.measured() {
				est := ""
				if p.Extrapolated != nil {
					est = fmt.Sprintf("extrapolated, not measured: ~%s to SERVING", fmtMs(p.Extrapolated.ServingMs))
				}
				fmt.Fprintf(tw, "%d\t%s\t0\tnot run: %s\t%s\t\t\t\t\n", n, s, orDash(p.Skipped), est)
				continue
			}
			answer, grpcAnswer, rate, rss := "—", "—", "—", "—"
			if s != stratFloor {
				answer, grpcAnswer = fmtSummary(p.FirstAnswerMs), fmtSummary(p.FirstGRPCMs)
				rss = fmt.Sprintf("%.1f", p.RSSMiB.Median)
			}
			if n > 0 {
				rate = fmt.Sprintf("%.0f", p.RatePerS.Median)
			}
			fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", n, s, len(p.Runs), answer, grpcAnswer,
				fmtSummary(p.ServingMs), fmtSummary(p.ReclaimMs), rate, rss)
		}
	}
	tw.Flush()
	if len(res.Breakdowns) > 0 {
		fmt.Fprintln(w, "\nreclaim.Run in process (diagnostic, one run per N):")
		for _, x := range res.Breakdowns {
			fmt.Fprintf(w, "  N=%d: %s = scan %s + /proc %s + unlink %s + wait %s + set %s (%d veths cut off)\n", x.N,
				fmtMs(x.TotalMs), fmtMs(x.ScanMs), fmtMs(x.ProcsMs), fmtMs(x.UnlinkMs), fmtMs(x.WaitMs), fmtMs(x.FirewallMs), x.CutOff)
		}
	}
	if l := res.Load; l != nil {
		fmt.Fprintf(w, "\nhealth latency at %d req/s (half gRPC Check, half HTTP /health), %d reps:\n", l.Rate, l.Reps)
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "\tkind\trequests\terrors\tp50\tp99\tmax")
		for _, c := range []struct {
			name string
			m    map[string]LatencyStats
		}{{fmt.Sprintf("reclaiming %d", l.N), l.Reclaim}, {"idle", l.Idle}} {
			for _, k := range []string{kindGRPC, kindHTTP} {
				st := c.m[k]
				fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t%s\n", c.name, k, st.Requests, st.Errors, fmtMs(st.P50Ms), fmtMs(st.P99Ms), fmtMs(st.MaxMs))
			}
		}
		tw.Flush()
	}
	fmt.Fprintln(w, "\ngoals (figures of this run; never asserted):")
	for _, g := range res.Goals {
		fmt.Fprintf(w, "  [%s] %s %s: %s", g.Status, g.Name, g.Target, g.Measured)
		if g.Note != "" {
			fmt.Fprintf(w, " — %s", g.Note)
		}
		fmt.Fprintln(w)
	}
	for _, n := range res.Notes {
		fmt.Fprintln(w, "note:", n)
	}
	m := res.Machine
	fmt.Fprintf(w, "\nmachine: %d CPUs (%s), Linux %s, %s; load average %.2f at start, %.2f at end (min %.2f, max %.2f)\n",
		m.NumCPU, m.CPU, m.Kernel, m.Go, m.LoadStart, m.LoadEnd, m.LoadMin, m.LoadMax)
}

// markdown renders the report; img prefixes the PNG file names.
func markdown(res *Results, img string) string {
	var b bytes.Buffer
	m, s := res.Machine, res.Settings
	fmt.Fprintf(&b, "Last run: %s–%s UTC (%.0f min)%s.\n\n", res.Started.UTC().Format("2006-01-02 15:04"),
		res.Finished.UTC().Format("15:04"), res.Finished.Sub(res.Started).Minutes(), revisionNote(res.Commit))
	fmt.Fprintf(&b, "Machine: %d CPUs (`nproc`), %s, %d MiB RAM, Linux %s, %s. Load average (1 min) %.2f at the start, "+
		"%.2f at the end, between %.2f and %.2f while it ran: the machine is shared with other builds and tests.\n\n",
		m.NumCPU, m.CPU, m.MemTotalMiB, m.Kernel, m.Go, m.LoadStart, m.LoadEnd, m.LoadMin, m.LoadMax)
	fmt.Fprintf(&b, "Reproduce (root):\n\n```sh\n%s\n```\n\n", res.Command)
	fmt.Fprintf(&b, "Settings: %d reps of phasegate and of the floor at each N, %d of the serial baseline (up to N=%d); "+
		"`--reclaim-workers %d`, `--pool-size %d --pool-min-ready 1`, `--slots %d`; %s pause after each run.\n\n",
		s.Reps, s.SerialReps, s.SerialMax, s.Workers, s.PoolSize, s.SlotIndices, fmtMs(s.SettleMs))

	b.WriteString("### Time to answer and time to SERVING (median [min–max] over the runs)\n\n")
	b.WriteString("| N leaked | phasegate: first HTTP answer | first gRPC answer | SERVING | kernel floor | SERVING / floor | serial: port answers | serial: SERVING | serial / phasegate | reclaim rate | RSS |\n")
	b.WriteString("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, n := range s.Ns {
		b.WriteString(markdownRow(res, n))
	}
	b.WriteString("\nphasegate and serial: exec of the binary → first answer (HTTP `GET /health`, 503 while starting; " +
		"gRPC `Watch` of service `\"\"`, NOT_SERVING) → SERVING on the Watch stream. Kernel floor: detach+unlink " +
		"of the netns files with the same number of workers until the host ends of the veths are gone (their " +
		"indices resolved before the clock starts; the set elements removed after, timed apart in results.json). Reclaim rate: the daemon's own `reclaim report`. RSS: the daemon's " +
		"VmRSS once the pool is full.\n\n")

	b.WriteString("### Goals\n\n| goal | target | measured | status |\n|---|---|---|---|\n")
	for _, g := range res.Goals {
		st := "**" + g.Status + "**"
		if g.Note != "" {
			st += " — " + g.Note
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", g.Name, g.Target, orDash(g.Measured), st)
	}
	b.WriteString("\n")
	if len(res.Breakdowns) > 0 {
		markdownBreakdowns(&b, res.Breakdowns)
	}
	if l := res.Load; l != nil {
		markdownLoad(&b, l)
	}
	for _, n := range res.Notes {
		fmt.Fprintf(&b, "- %s\n", n)
	}
	if len(res.Notes) > 0 {
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "![time to first answer vs N](%sanswer.png)\n![time to SERVING vs N](%sserving.png)\n\n", img, img)
	fmt.Fprintf(&b, "![startup timeline](%stimeline.png)\n", img)
	if hasSerialTimeline(res) {
		fmt.Fprintf(&b, "![serial baseline timeline](%stimeline-serial.png)\n", img)
	}
	return b.String()
}

// markdownRow renders one N of the main table.
func markdownRow(res *Results, n int) string {
	pg, fl, se := res.find(stratPhasegate, n), res.find(stratFloor, n), res.find(stratSerial, n)
	cells := []string{fmt.Sprintf("%d", n), "—", "—", "—", "—", "—", "—", "—", "—", "—", "—"}
	if pg.measured() {
		cells[1], cells[2], cells[3] = fmtSummary(pg.FirstAnswerMs), fmtSummary(pg.FirstGRPCMs), fmtSummary(pg.ServingMs)
		cells[10] = fmt.Sprintf("%.1f MiB", pg.RSSMiB.Median)
		if n > 0 {
			cells[9] = fmt.Sprintf("%.0f/s", pg.RatePerS.Median)
		}
	}
	if fl.measured() && n > 0 {
		cells[4] = fmtSummary(fl.ServingMs)
		if pg.measured() {
			cells[5] = fmt.Sprintf("%.2f×", pg.ServingMs.Median/fl.ServingMs.Median)
		}
	}
	switch {
	case se.measured():
		cells[6], cells[7] = fmtSummary(se.FirstAnswerMs), fmtSummary(se.ServingMs)
		if pg.measured() {
			cells[8] = fmt.Sprintf("%.0f×", se.ServingMs.Median/pg.ServingMs.Median)
		}
	case se != nil && se.Extrapolated != nil:
		cells[6] = "not run"
		cells[7] = fmt.Sprintf("~%s *extrapolated*", fmtMs(se.Extrapolated.ServingMs))
		if pg.measured() {
			cells[8] = fmt.Sprintf("~%.0f× *extrapolated*", se.Extrapolated.ServingMs/pg.ServingMs.Median)
		}
	case se != nil:
		cells[6], cells[7] = "not run", "not run"
	}
	return "| " + strings.Join(cells, " | ") + " |\n"
}

// markdownLoad renders the latency table.
func markdownLoad(b *bytes.Buffer, l *LoadResult) {
	fmt.Fprintf(b, "### Health latency while reclaiming %d slots vs idle\n\n", l.N)
	fmt.Fprintf(b, "A separate load-generator process sends %d requests/s to 127.0.0.1 (half gRPC `Check`, half "+
		"HTTP `GET /health`, open loop, one gRPC connection, keep-alive HTTP), %d reps; \"during reclaim\" counts "+
		"the requests sent while the daemon's reclaim phase ran (%s per rep), \"idle\" a serving daemon with "+
		"nothing to reclaim.\n\n", l.Rate, l.Reps, windowList(l.WindowMs))
	b.WriteString("| | kind | requests | errors | p50 | p99 | max |\n|---|---|---:|---:|---:|---:|---:|\n")
	for _, c := range []struct {
		name string
		m    map[string]LatencyStats
	}{{"during reclaim", l.Reclaim}, {"idle", l.Idle}} {
		for _, k := range []string{kindGRPC, kindHTTP} {
			st := c.m[k]
			fmt.Fprintf(b, "| %s | %s | %d | %d | %s | %s | %s |\n", c.name, k, st.Requests, st.Errors,
				fmtMs(st.P50Ms), fmtMs(st.P99Ms), fmtMs(st.MaxMs))
		}
	}
	b.WriteString("\n")
}

// markdownBreakdowns renders where the in-process reclaim spent its time.
func markdownBreakdowns(b *bytes.Buffer, bs []Breakdown) {
	b.WriteString("### Where phasegate's reclaim time goes (diagnostic)\n\n")
	b.WriteString("`reclaim.Run` (the code of the daemon's reclaim phase) run in process once per N on a freshly " +
		"leaked set, with the report's own split: scan (netns directory, link dump, set listing), /proc scan for " +
		"processes inside the namespaces, detach+unlink (workers), wait until the host ends are gone, one nftables " +
		"transaction.\n\n")
	b.WriteString("| N | total | scan | /proc | detach+unlink | wait | set elements | veths cut off |\n|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, x := range bs {
		fmt.Fprintf(b, "| %d | %s | %s | %s | %s | %s | %s | %d |\n", x.N, fmtMs(x.TotalMs), fmtMs(x.ScanMs),
			fmtMs(x.ProcsMs), fmtMs(x.UnlinkMs), fmtMs(x.WaitMs), fmtMs(x.FirewallMs), x.CutOff)
	}
	b.WriteString("\n")
}

func windowList(ws []float64) string {
	parts := make([]string, 0, len(ws))
	for _, w := range ws {
		parts = append(parts, fmtMs(w))
	}
	return strings.Join(parts, ", ")
}

func orDash(s string) string {
	if s == "" {
		return "—"
	}
	return s
}

// revisionNote names the commit the run measured, if known.
func revisionNote(commit string) string {
	if commit == "" {
		return ""
	}
	return ", commit " + commit
}
