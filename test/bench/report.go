package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Markers delimiting the generated section of the -doc file.
const (
	docStart = "<!-- bench:start -->"
	docEnd   = "<!-- bench:end -->"
)

// writeOutputs writes results.json to o.results, the plots and report.md
// to o.out, and updates o.doc's generated section.
func writeOutputs(res *Results, o options) error {
	for _, dir := range []string{o.out, o.results} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("output dir: %w", err)
		}
	}
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(o.resultsFile(), append(b, '\n'), 0o644); err != nil {
		return err
	}
	if err := writePlots(res, o.out); err != nil {
		return fmt.Errorf("plots: %w", err)
	}
	if err := os.WriteFile(filepath.Join(o.out, "report.md"), []byte(markdown(res, "")), 0o644); err != nil {
		return err
	}
	if o.doc != "" {
		rel, err := filepath.Rel(filepath.Dir(o.doc), o.out)
		if err != nil {
			return fmt.Errorf("-doc: %w", err)
		}
		if err := replaceSection(o.doc, docStart, docEnd, markdown(res, filepath.ToSlash(rel)+"/")); err != nil {
			return fmt.Errorf("-doc: %w", err)
		}
	}
	if o.headline != "" {
		h, err := headline(res)
		if err != nil {
			return fmt.Errorf("-headline %s: %w", o.headline, err)
		}
		if err := replaceSection(o.headline, headlineStart, headlineEnd, h); err != nil {
			return fmt.Errorf("-headline: %w", err)
		}
	}
	return nil
}

// replaceSection replaces what lies between the markers start and end in
// file.
func replaceSection(file, start, end, body string) error {
	b, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	s := string(b)
	i, j := strings.Index(s, start), strings.Index(s, end)
	if i < 0 || j < i {
		return fmt.Errorf("%s: no %s … %s section", file, start, end)
	}
	out := s[:i+len(start)] + "\n" + body + s[j:]
	return os.WriteFile(file, []byte(out), 0o644)
}

// markdown renders the report; img prefixes the PNG file names.
func markdown(res *Results, img string) string {
	var b bytes.Buffer
	m := res.Machine
	fmt.Fprintf(&b, "Machine: %d CPUs (`nproc`), %s, %d MiB RAM, Linux %s, %s; the daemon's `--state-dir` on %s. "+
		"The machine is shared with other builds and tests: each part gives the load average (1 min) while it ran.\n\n",
		m.NumCPU, m.CPU, m.MemTotalMiB, m.Kernel, m.Go, orDash(m.StateFS))
	b.WriteString("| part | measured (UTC) | load average: start–end (min–max) | commit | reproduce (root) |\n|---|---|---|---|---|\n")
	for _, name := range allParts {
		p := res.Parts[name]
		if p == nil {
			continue
		}
		inc := ""
		if p.Incomplete != "" {
			inc = " **incomplete**"
		}
		fmt.Fprintf(&b, "| %s%s | %s–%s (%.0f min) | %.2f–%.2f (%.2f–%.2f) | %s | `%s` |\n", name, inc,
			p.Started.UTC().Format("2006-01-02 15:04"), p.Finished.UTC().Format("15:04"), p.Finished.Sub(p.Started).Minutes(),
			p.Load.Start, p.Load.End, p.Load.Min, p.Load.Max, orDash(p.Commit), strings.ReplaceAll(p.Command, "|", `\|`))
	}
	b.WriteString("\n### Goals\n\n| goal | target | measured | status |\n|---|---|---|---|\n")
	for _, g := range res.Goals {
		st := "**" + g.Status + "**"
		if g.Note != "" {
			st += " — " + g.Note
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", g.Name, g.Target, orDash(g.Measured), st)
	}
	b.WriteString("\n")
	if len(res.ns(deadStrategies)) > 0 {
		markdownDead(&b, res, img)
	}
	if len(res.ns(allRestoreStrategies)) > 0 {
		markdownRestore(&b, res)
	}
	if l := res.Load; l != nil {
		markdownLoad(&b, l, img)
	}
	if a := res.Acquire; a != nil {
		markdownAcquire(&b, a, img)
	}
	if c := res.CNI; c != nil {
		markdownCNI(&b, c)
	}
	if s := res.SlotRate; s != nil {
		markdownSlotRate(&b, s)
	}
	if u := res.Upgrade; u != nil {
		markdownUpgrade(&b, u, img)
	}
	if f := res.Flood; f != nil {
		markdownFlood(&b, f)
	}
	if ab := res.AB; ab != nil {
		markdownAB(&b, ab)
	}
	if len(res.Breakdowns) > 0 {
		markdownBreakdowns(&b, res.Breakdowns)
	}
	for _, n := range res.Notes {
		fmt.Fprintf(&b, "- %s\n", n)
	}
	return b.String()
}

func markdownDead(b *bytes.Buffer, res *Results, img string) {
	s := res.Parts[partDead]
	b.WriteString("### Restart with N dead slots: background reclaim vs foreground vs serial vs the kernel floor\n\n")
	if s != nil {
		fmt.Fprintf(b, "%d reps of each strategy at each N (the serial baseline %d, up to N=%d), interleaved; `--reclaim-workers %d`, "+
			"`--pool-size %d --pool-min-ready 1`, `--slots %d`; median [min–max].\n\n",
			s.Settings.Reps, s.Settings.SerialReps, s.Settings.SerialMax, s.Settings.Workers, s.Settings.PoolSize, s.Settings.SlotIndices)
	}
	b.WriteString("| N dead | first HTTP answer | SERVING (background) | dead gone, from exec | dead gone, from SERVING | foreground: SERVING | serial: SERVING | kernel floor | floor / SERVING | gone after SERVING / floor | RSS |\n")
	b.WriteString("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, n := range res.ns(deadStrategies) {
		bg, fg, se, fl := res.find(stratBackground, n), res.find(stratForeground, n), res.find(stratSerial, n), res.find(stratFloor, n)
		c := []string{fmt.Sprint(n), "—", "—", "—", "—", "—", "—", "—", "—", "—", "—"}
		if bg.measured() {
			c[1], c[2] = fmtSummary(bg.FirstAnswerMs), fmtSummary(bg.ServingMs)
			c[10] = fmt.Sprintf("%.1f MiB", bg.RSSMiB.Median)
			if n > 0 {
				c[3], c[4] = fmtSummary(bg.DeadGoneMs), fmtSummary(bg.AfterServingMs)
			}
		}
		if fg.measured() {
			c[5] = fmtSummary(fg.ServingMs)
		}
		switch {
		case se.measured():
			c[6] = fmtSummary(se.ServingMs)
		case se != nil && se.Extrapolated != nil:
			c[6] = fmt.Sprintf("~%s *extrapolated*", fmtMs(se.Extrapolated.ServingMs))
		case se != nil:
			c[6] = "not run"
		}
		if fl.measured() && n > 0 {
			c[7] = fmtSummary(fl.ServingMs)
			if bg.measured() {
				c[8] = fmt.Sprintf("%.1f×", fl.ServingMs.Median/bg.ServingMs.Median)
				c[9] = fmt.Sprintf("%.2f×", bg.AfterServingMs.Median/fl.ServingMs.Median)
			}
		}
		b.WriteString("| " + strings.Join(c, " | ") + " |\n")
	}
	b.WriteString("\nEach strategy gets its own freshly leaked set: N netns files, each with a veth pair (host end up with " +
		"its /31) and an nftables set element, unrecorded — what a killed run leaves. *background* is the daemon's " +
		"default (`--reclaim=background`), *foreground* `--reclaim=foreground` (dead slots torn down before the warm " +
		"slots: the start before live restore), *serial* the benchmark's own program `test/bench/serialbaseline` " +
		"(E2B's orchestrator, not phasegate: the library's parts in its order, serial per-slot reclaim, port bound last). Times from the exec of the binary: first HTTP answer on `/health` (503 while " +
		"starting), SERVING on a grpc.health.v1 `Watch`, dead gone when the daemon's `reclaim report` line reaches " +
		"the benchmark (it is logged once every namespace, veth and set element of the dead is gone; the benchmark " +
		"then checks that none of the leaked host veths is left). Kernel floor: no daemon, detach+unlink of the " +
		"netns files with as many workers, until the host veths are gone (set elements removed after, timed apart " +
		"in results.json). RSS: the daemon's VmRSS once its pool is full.\n\n")
	fmt.Fprintf(b, "![time to SERVING vs N](%sserving.png)\n![dead slots gone vs N](%sreclaim.png)\n\n", img, img)
	fmt.Fprintf(b, "![startup timeline](%stimeline.png)\n", img)
	if hasTimeline(res, stratSerial) {
		fmt.Fprintf(b, "![serial baseline timeline](%stimeline-serial.png)\n", img)
	}
	b.WriteString("\n")
}

func markdownRestore(b *bytes.Buffer, res *Results) {
	s := res.Parts[partRestore]
	b.WriteString("### Restart with N leased slots (live restore)\n\n")
	if s != nil {
		fmt.Fprintf(b, "N slots leased through the API (`Acquire` with request ids, %d concurrent callers), then %d restarts "+
			"after a SIGTERM and %d after a kill -9, alternately, on the same leased set. Restored, adopted and lost are the "+
			"start's own `restore:` line and its verification of the leases, which runs after SERVING (*all verified*: exec → "+
			"its end; *restored* counts the leases it found intact); *listed* counts the slots `List` shows ACQUIRED by their owner once verified; "+
			"*destroyed* counts leased slots whose netns inode or host veth ifindex changed or vanished (checked by the "+
			"benchmark on the host). Median [min–max]; the counts are the worst run.\n\n", s.Settings.LeaseClients, s.Settings.Reps, s.Settings.Reps)
		if s.Settings.GuestFlags != "" {
			fmt.Fprintf(b, "*guest+policy*: at each N, after the plain variant, the same with the microVM guest profile, `phasegate serve … %s` "+
				"(every slot made with its tap, forwarding and guest NAT), and every lease acquired with an egress policy: %s. "+
				"After each restart, once the daemon's background check of the leases' insides (`verify-inside`, after SERVING) has ended "+
				"(*inside verified*: exec → its end), the benchmark checks every lease's policy in `List` against the one it was acquired with, "+
				"and reads %d sampled leases' namespaces (`nft -a -s list ruleset`, `ip -o link show dev %s`: tables, rules with their "+
				"handles, the tap's ifindex) against what they held before the first restart: a table or rule written again, or a tap "+
				"made again, has new ones. *policies, samples, repaired*: policies kept / N, samples unchanged / sampled, and what "+
				"`verify-inside` repaired (its own log line).\n\n",
				s.Settings.GuestFlags, s.Settings.GuestPolicies, guestSample, guestTap)
		}
	}
	b.WriteString("| N leased | leasing them (API) | restart | first HTTP answer | SERVING | all verified | restored | listed | lost | destroyed | SIGTERM → exit | inside verified | policies, samples, repaired | before live restore: SERVING (foreground, destroys them) | kernel floor | RSS |\n")
	b.WriteString("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, n := range res.ns(allRestoreStrategies) {
		fg, fl := res.find(stratForeground, n), res.find(stratFloor, n)
		fgs, fls := "—", "—"
		if fg.measured() {
			fgs = fmtSummary(fg.ServingMs)
		}
		if fl.measured() && n > 0 {
			fls = fmtSummary(fl.ServingMs)
		}
		for _, st := range allRestoreStrategies {
			leasing := leasingCell(res, n, slices.Contains(guestStrategies, st), slices.Contains(datapathStrategies, st))
			p := res.find(st, n)
			if p != nil && p.noStarts() > 0 {
				fmt.Fprintf(b, "| %d | %s | %s | **never served: %d starts in a row failed** (%d of %d restarts) | | | | | | | | | | %s | %s | |\n", n, leasing,
					restartName(st), maxStartAttempts, p.noStarts(), len(p.Runs), fgs, fls)
			}
			if !p.measured() {
				continue
			}
			w := worstRestore(p)
			stop := "—"
			if st == stratRestoreTerm || st == stratGuestTerm || st == stratDatapathTerm {
				stop = fmtSummary(p.StopMs)
			}
			inside, checks := guestColumns(p, w)
			fmt.Fprintf(b, "| %d | %s | %s | %s | %s | %s | %d/%d | %d | %d | %d | %s | %s | %s | %s | %s | %.1f MiB |\n", n, leasing, restartName(st),
				fmtSummary(p.FirstAnswerMs), fmtSummary(p.ServingMs), fmtVerified(p), w.Restored, n, w.Listed, w.Lost, w.Destroyed, stop,
				inside, checks, fgs, fls, p.RSSMiB.Median)
		}
	}
	b.WriteString("\n")
}

// leasingCell is how long leasing n slots took in a variant, or "—".
func leasingCell(res *Results, n int, guest, datapath bool) string {
	for _, l := range res.Leasing {
		if l.N == n && l.Guest == guest && l.Datapath == datapath {
			return fmt.Sprintf("%s (%.0f/s)", fmtMs(l.Ms), l.PerS)
		}
	}
	return "—"
}

// loadWindow is one of the load part's windows.
type loadWindow struct {
	name string
	m    map[string]LatencyStats
	pick func(LoadRun) map[string]LatencyStats
}

func loadWindows(l *LoadResult) []loadWindow {
	none := func(LoadRun) map[string]LatencyStats { return nil }
	ws := []loadWindow{
		{fmt.Sprintf("during the reclaim of %d", l.N), l.Reclaim, func(r LoadRun) map[string]LatencyStats { return r.Reclaim }},
		{"control server, same time", l.Control, func(r LoadRun) map[string]LatencyStats { return r.Control }},
		{"after a start, nothing to reclaim", l.Start, func(r LoadRun) map[string]LatencyStats { return r.Start }},
		{"idle", l.Idle, func(r LoadRun) map[string]LatencyStats { return r.Idle }},
	}
	if c := l.Checker; c != nil {
		ws = append(ws, loadWindow{fmt.Sprintf("checker rates, during the reclaim of %d", l.N), c.Reclaim, none},
			loadWindow{"checker rates, control server, same time", c.Control, none})
	}
	return ws
}

// perRepP99 lists each rep's p99 of kind in a window.
func perRepP99(l *LoadResult, pick func(LoadRun) map[string]LatencyStats, kind string) string {
	var parts []string
	for _, r := range l.Runs {
		if st, ok := pick(r)[kind]; ok {
			parts = append(parts, fmtMs(st.P99Ms))
		}
	}
	return strings.Join(parts, ", ")
}

func markdownLoad(b *bytes.Buffer, l *LoadResult, img string) {
	fmt.Fprintf(b, "### Health and Acquire latency during the background reclaim of %d dead slots\n\n", l.N)
	checker := ""
	if c := l.Checker; c != nil {
		checker = fmt.Sprintf(" A third start on %d dead slots per rep is probed at the rates real checkers use, %d HTTP checks/s and "+
			"%d gRPC `Check`s/s, the control server beside it the same way (*checker rates* rows; reclaim windows %s).",
			l.N, c.HTTPRate, c.GRPCRate, windowList(c.WindowMs))
	}
	fmt.Fprintf(b, "A load-generator process sends %d health checks/s to 127.0.0.1 (half gRPC `Check` on one kept connection, "+
		"half HTTP `GET /health` on keep-alive connections, open loop, 2 s timeout); "+
		"another sends the same to the *control server* (`bench control`: a bare net/http server and grpc-go's health server "+
		"in a process of their own, no phasegate) at the same time, so that each figure of the daemon stands beside what "+
		"the machine gives any server in the same seconds; a third calls `Acquire` (each with "+
		"its own request id, 10 s timeout) at %d/s. All run before the daemon starts. %d reps, each of three windows: "+
		"*during the reclaim*: a start on %d dead slots, the requests sent from SERVING to the end of the daemon's "+
		"`reclaim-dead` task (%s per rep); *after a start, nothing to reclaim*: a start on a clean host, the same length "+
		"of time from SERVING (what the start itself costs: the same-run baseline that isolates the reclaim); *idle*: that "+
		"daemon %s after a second past its full pool. An error is a request without an answer (NOT_SERVING and 503 are "+
		"answers). *Generator lag*: how late the generator sent (p99); tens of ms or more mean the machine starved the "+
		"client too, and that it then sent in bursts.%s\n\n",
		l.Rate, l.AcquireRate, l.Reps, l.N, windowList(l.WindowMs), fmtMs(idleMs(l)), checker)
	b.WriteString("| window | kind | requests | errors | over 1 s | p50 | p99 | max | p99 of each rep | generator lag p99 |\n|---|---|---:|---:|---:|---:|---:|---:|---|---:|\n")
	for _, c := range loadWindows(l) {
		for _, k := range []string{kindGRPC, kindHTTP, kindAcquire} {
			if st, ok := c.m[k]; ok {
				fmt.Fprintf(b, "| %s | %s | %d | %d | %d | %s | %s | %s | %s | %s |\n", c.name, k, st.Requests, st.Errors, st.Over1s,
					fmtMs(st.P50Ms), fmtMs(st.P99Ms), fmtMs(st.MaxMs), perRepP99(l, c.pick, k), fmtMs(st.LagP99Ms))
			}
		}
	}
	fmt.Fprintf(b, "\n![latency during the reclaim, after a start, idle](%slatency.png)\n![latency over time during the reclaim](%slatency-series.png)\n\n", img, img)
}

// idleMs is how long the idle window lasted, from its sample count.
func idleMs(l *LoadResult) float64 {
	st := l.Idle[kindGRPC]
	if l.Reps == 0 || l.Rate == 0 {
		return 0
	}
	return 1000 * float64(2*st.Requests) / float64(l.Rate*l.Reps)
}

func markdownAcquire(b *bytes.Buffer, a *AcquireResult, img string) {
	b.WriteString("### Acquire over gRPC: durable record vs in-memory map\n\n")
	warm, refill := a.WarmPool, "Neither pool makes a slot during the burst: each still holds its reserve (a quarter of its target) "+
		"at the end of it, so its refill waits for the lull after it, and each pool is made, and the kernel left to settle, before the burst."
	if warm == 0 { // results from before the pool held its reserve through the burst
		warm, refill = a.Calls, "Both pools refill in the background during the burst."
	}
	fmt.Fprintf(b, "Each side serves `phasegate.v1.Slots` on a Unix socket (the daemon on its control socket) with a warm pool of %d slots and answers a burst of %d "+
		"`Acquire` calls (own request id each) from %d concurrent callers on one connection, so no call waits for a slot "+
		"to be made; %d bursts per side, the order alternating. *durable*: the daemon, which writes the lease's record "+
		"in its journal before it replies (one append for the calls committed together, fdatasync'd unless the state directory is on tmpfs, as -state-parent is by default; "+
		"written into the bbolt file when the calls pause), and an idle record for every slot its pool makes. *in-memory*: "+
		"`bench memslots`, the daemon's own Slots service behind the same control guard (peer credentials, policy, audit line; "+
		"the daemon runs with `--control-rate=0`, so no rate limit) on the same one-port server (package `server`), over "+
		"the same pool, allocator and slot manager, but over a store that keeps the records in a map under a mutex; "+
		"it lacks the daemon's metric interceptors and tracing stats handler. %s\n\n", warm, a.Calls, a.Clients, a.Reps, refill)
	b.WriteString("| side | calls/s (median [min–max] over bursts) | p50 | p99 | max | errors |\n|---|---:|---:|---:|---:|---:|\n")
	for _, s := range []struct {
		name string
		sd   AcquireSide
	}{{"durable (daemon)", a.Durable}, {"in-memory (baseline)", a.Memory}} {
		fmt.Fprintf(b, "| %s | %s | %s | %s | %s | %d |\n", s.name, fmtRate(s.sd.PerS), fmtMs(s.sd.Latency.P50Ms),
			fmtMs(s.sd.Latency.P99Ms), fmtMs(s.sd.Latency.MaxMs), s.sd.Latency.Errors)
	}
	fmt.Fprintf(b, "\n![Acquire throughput and latency](%sacquire.png)\n\n", img)
}

func markdownUpgrade(b *bytes.Buffer, u *UpgradeResult, img string) {
	b.WriteString("### New connections across upgrades and restarts\n\n")
	fmt.Fprintf(b, "A load-generator process opens %d new TCP connections/s to the daemon's port (alternately HTTP `GET /health` "+
		"and gRPC `Check`, one request each, 2 s timeout) while the benchmark upgrades the daemon in place (SIGHUP: "+
		"same pid, the socket and the lock handed over across an exec of the binary) and while it stops it (SIGTERM) "+
		"and starts it again, first with the port closed between the two, then with the socket held by the benchmark "+
		"and handed to each start as systemd's socket activation does (`LISTEN_FDS`). %d slots stay leased throughout. "+
		"*refused*: ECONNREFUSED; *failed*: any other error (reset, timeout); NOT_SERVING/503 are answers. "+
		"Signal → SERVING: until the new image logs `serving`.\n\n", u.Rate, u.Leases)
	b.WriteString("| scenario | events | signal → SERVING | probes | SERVING/200 | NOT_SERVING/503 | refused | failed | answer p99 | leases restored (fewest) | destroyed |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, s := range u.Scenarios {
		fmt.Fprintf(b, "| %s | %d | %s | %d | %d | %d | %d | %d | %s | %d/%d | %d |\n", s.Name, s.Events, fmtSummary(s.GapMs),
			s.Probes, s.Serving, s.NotServing, s.Refused, s.Failed, fmtMs(s.LatencyP99Ms), s.Restored, u.Leases, s.Destroyed)
	}
	for _, s := range u.Scenarios {
		if s.FirstError != "" {
			fmt.Fprintf(b, "\nFirst failure (not a refusal), %s: `%s`\n", s.Name, s.FirstError)
		}
	}
	fmt.Fprintf(b, "\n![connections across upgrades and restarts](%supgrade.png)\n\n", img)
}

// markdownBreakdowns renders where the in-process reclaim spent its time.
func markdownBreakdowns(b *bytes.Buffer, bs []Breakdown) {
	b.WriteString("### Where the reclaim's time goes (diagnostic, -breakdown)\n\n")
	b.WriteString("`reclaim.Run` run in process once per N on a freshly leaked set, with the report's own split.\n\n")
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

func markdownFlood(b *bytes.Buffer, f *FloodResult) {
	b.WriteString("### Health and the owner's Acquire during a connection flood from another user\n\n")
	fmt.Fprintf(b, "A daemon with the machine's open files limit (the port's bounds as `phasegate serve --check` prints them), probed from "+
		"its start by two load-generator processes as root: %d checks/s on a new TCP connection each (alternately HTTP `GET /health` and "+
		"gRPC `Check`, 2 s timeout), and the owner's `Acquire` on the control socket at %d/s (one kept connection). Three windows "+
		"of %s each on the same daemon: *quiet*; *flooded*, while `%s` (`runuser`) runs `bench flood`: as many gRPC connections "+
		"to the port as it can get, topped up to %d each second, a `Check` on each, held (the connections the port refuses are "+
		"tried again at the next round); and *flood elsewhere*, the same flood aimed at `bench sink`, a bare socket on another port that "+
		"refuses every connection as the port refuses one over its bound (accept, reset): what the flood costs the machine, and so "+
		"the daemon's checks, whatever it floods. The order of the windows turns from rep to rep; %d reps. An error is a request "+
		"without an answer.\n\n", f.ProbeRate, f.AcquireRate, fmtMs(f.WindowMs), floodUser, f.Conns, f.Reps)
	b.WriteString("| window | kind | requests | errors | over 1 s | p50 | p99 | max | p99 of each rep |\n|---|---|---:|---:|---:|---:|---:|---:|---|\n")
	for _, w := range []struct {
		name string
		m    map[string]LatencyStats
		pick func(FloodRun) map[string]LatencyStats
	}{
		{winQuiet, f.Quiet, func(r FloodRun) map[string]LatencyStats { return r.Quiet }},
		{winFlood, f.Flood, func(r FloodRun) map[string]LatencyStats { return r.Flood }},
		{winElsewhere, f.Elsewhere, func(r FloodRun) map[string]LatencyStats { return r.Elsewhere }},
	} {
		for _, k := range []string{kindGRPC, kindHTTP, kindAcquire} {
			st, ok := w.m[k]
			if !ok {
				continue
			}
			var reps []string
			for _, r := range f.Runs {
				reps = append(reps, fmtMs(w.pick(r)[k].P99Ms))
			}
			fmt.Fprintf(b, "| %s | %s | %d | %d | %d | %s | %s | %s | %s |\n", w.name, k, st.Requests, st.Errors, st.Over1s,
				fmtMs(st.P50Ms), fmtMs(st.P99Ms), fmtMs(st.MaxMs), strings.Join(reps, ", "))
		}
	}
	b.WriteString("\n| rep | windows | connections nobody held | its attempts | refused | the daemon's descriptors, at most | its VmRSS, at most | " +
		"the daemon's CPU: quiet | flooded | flood elsewhere | the flood's CPU |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for i, r := range f.Runs {
		fmt.Fprintf(b, "| %d | %s | %d | %d | %d | %d | %.0f MiB | %.0f%% | %.0f%% | %.0f%% | %.0f%% |\n", i+1, strings.Join(r.Order, ", "),
			r.Report.Held, r.Report.Attempts, r.Report.Refused, r.MaxFDs, r.MaxRSSMiB,
			100*r.DaemonCPUQuiet, 100*r.DaemonCPUFlood, 100*r.DaemonCPUElsewhere, 100*r.FloodCPU)
	}
	b.WriteString("\n")
}
