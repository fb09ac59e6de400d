package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSmoke builds the benchmark, runs every part as a user would with
// tiny sizes (one rep) and checks what it writes: every strategy measured
// with the counts it must have (the dead reclaimed, the leases restored
// and listed, none destroyed), the latency, Acquire and upgrade parts
// filled in, the PNGs decodable and the -doc section replaced. It asserts
// no timing: the figures of a 20-slot run on a shared machine mean nothing.
func TestSmoke(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("PHASEGATE_REQUIRE_TOOLS") == "1" {
			t.Fatal("the benchmark needs root")
		}
		t.Skip("the benchmark needs root")
	}
	r := newSmokeRig(t)
	r.run(t)

	if _, err := os.Stat(filepath.Join(r.out, "results.json")); err == nil {
		t.Error("results.json written to -out, beside the rendered report")
	}
	res, err := readResults(filepath.Join(r.cache, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	checkSmokeCNI(t, res)
	checkSmokeStarts(t, res)
	checkSmokeLoad(t, res)
	checkSmokeAcquireAndUpgrade(t, res)
	checkSmokeFlood(t, res)
	checkSmokeAB(t, res)
	if len(res.Goals) == 0 || len(res.Parts) != len(allParts) {
		t.Errorf("results.json: %d goals, parts %v", len(res.Goals), res.Parts)
	}
	for _, name := range []string{"serving.png", "reclaim.png", "timeline.png", "timeline-serial.png", "latency.png", "latency-series.png", "acquire.png", "upgrade.png"} {
		checkPNG(t, filepath.Join(r.out, name))
	}
	r.checkSectionsReplaced(t)

	// -from re-renders the same report from the cached results.json.
	again := filepath.Join(r.dir, "again")
	if b, err := exec.Command(r.bin, "-from", "-results", r.cache, "-out", again).CombinedOutput(); err != nil {
		t.Fatalf("bench -from: %v\n%s", err, b)
	}
	if want, got := readFile(t, filepath.Join(r.out, "report.md")), readFile(t, filepath.Join(again, "report.md")); want != got {
		t.Errorf("-from rendered another report.md:\n%s\nwant:\n%s", got, want)
	}
}

// smokeRig is TestSmoke's benchmark binary and the files it writes: the
// rendered report (out), the cached results (cache) and the two documents
// whose marked sections it replaces (doc, readme).
type smokeRig struct {
	dir, bin, out, cache, doc, readme string
}

// newSmokeRig builds the benchmark into a temporary directory and writes
// the -doc and -headline documents with an old section between text that
// must stay.
func newSmokeRig(t *testing.T) *smokeRig {
	t.Helper()
	dir := t.TempDir()
	r := &smokeRig{
		dir:    dir,
		bin:    filepath.Join(dir, "bench"),
		out:    filepath.Join(dir, "out"),
		cache:  filepath.Join(dir, "cache"),
		doc:    filepath.Join(dir, "BENCHMARKS.md"),
		readme: filepath.Join(dir, "README.md"),
	}
	if out, err := exec.Command("go", "build", "-o", r.bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	if err := os.WriteFile(r.doc, []byte("# B\n\nbefore\n"+docStart+"\nold\n"+docEnd+"\nafter\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(r.readme, []byte("# R\n"+headlineStart+"\nold\n"+headlineEnd+"\nafter\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return r
}

// run runs every part of the benchmark once with tiny sizes.
func (r *smokeRig) run(t *testing.T) {
	t.Helper()
	// -load-n 200: the windows after the start last as long as the
	// reclaim of the dead, which takes ~10 ms for 20 (no Acquire at 10/s
	// falls in it) and ~0.1 s for 200.
	cmd := exec.Command(r.bin, "-n", "0,20", "-reps", "1", "-load-n", "200", "-load-reps", "1",
		"-idle-duration", "1s", "-settle", "200ms", "-acquire-n", "40", "-slotrate-n", "20", "-upgrades", "2", "-restarts", "1",
		"-upgrade-leases", "4", "-restore-datapath", "-flood-duration", "2s", "-cni-calls", "10", "-cni-gc", "20", "-cni-podman", "1",
		"-parts", strings.Join(allParts, ","), "-ab-reps", "1", "-ab-starts", "1", "-ab-window", "1s", "-ab-slot", "250ms", "-ab-rates", "100", "-ab-tls-rates", "100",
		"-out", r.out, "-results", r.cache, "-doc", r.doc, "-headline", r.readme)
	start := time.Now()
	stdout, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("bench: %v\nstdout:\n%s\nstderr:\n%s", err, stdout, stderr)
	}
	t.Logf("bench ran in %v:\n%s", time.Since(start).Round(time.Second), stdout)
}

// checkSectionsReplaced checks that -doc and -headline replaced their
// marked sections and kept the text around them.
func (r *smokeRig) checkSectionsReplaced(t *testing.T) {
	t.Helper()
	b, err := os.ReadFile(r.doc)
	if err != nil {
		t.Fatal(err)
	}
	if s := string(b); strings.Contains(s, "\nold\n") || !strings.Contains(s, "serving.png") ||
		!strings.HasPrefix(s, "# B\n\nbefore\n") || !strings.HasSuffix(s, docEnd+"\nafter\n") {
		t.Errorf("-doc section not replaced as expected:\n%s", s)
	}
	if b, err = os.ReadFile(r.readme); err != nil {
		t.Fatal(err)
	}
	if s := string(b); strings.Contains(s, "\nold\n") || !strings.Contains(s, "| 20 leaked (dead) slots |") ||
		!strings.Contains(s, "| 20 leased slots (SIGTERM or kill -9) |") || !strings.Contains(s, "Across 2 in-place upgrades") ||
		!strings.HasPrefix(s, "# R\n"+headlineStart+"\n") || !strings.HasSuffix(s, headlineEnd+"\nafter\n") {
		t.Errorf("-headline section not replaced as expected:\n%s", s)
	}
}

// checkSmokeCNI checks the CNI part: every side, the GC, the floor and
// podman measured, every ADD made and none failed.
func checkSmokeCNI(t *testing.T, res *Results) {
	t.Helper()
	if c := res.CNI; c == nil || len(c.Sides) != 4 || len(c.GCMs) != 1 || len(c.FloorMs) != 1 || len(c.Podman[pluginReference]) != 1 {
		t.Errorf("results.json: the CNI part is not all there: %+v", c)
	} else {
		for _, sd := range c.Sides {
			if sd.Add.Requests != 10 || sd.Add.Errors+sd.Del.Errors != 0 {
				t.Errorf("results.json: CNI %s with %d callers: %d ADDs, %d errors", sd.Plugin, sd.Callers, sd.Add.Requests, sd.Add.Errors+sd.Del.Errors)
			}
		}
	}
}

// checkSmokeStarts checks the start-up strategies: the dead reclaimed,
// the leases restored and listed, none destroyed, verify-inside's checks
// all kept.
func checkSmokeStarts(t *testing.T, res *Results) {
	t.Helper()
	for _, s := range deadStrategies {
		for _, n := range []int{0, 20} {
			p := res.find(s, n)
			if !p.measured() {
				t.Errorf("results.json: no runs of %s at N=%d", s, n)
				continue
			}
			if n == 20 && p.Runs[0].Reclaimed != 20 {
				t.Errorf("%s at N=20 reclaimed %d", s, p.Runs[0].Reclaimed)
			}
			if s != stratFloor && (p.ServingMs.Median <= 0 || p.FirstAnswerMs.Median <= 0) {
				t.Errorf("%s at N=%d: no times: %+v", s, n, p.Runs[0])
			}
			if s == stratBackground && n == 20 && p.Runs[0].DeadGoneMs <= 0 {
				t.Errorf("background at N=20: no time until the dead were gone: %+v", p.Runs[0])
			}
		}
	}
	for _, s := range restoreStrategies {
		p := res.find(s, 20)
		if !p.measured() {
			t.Errorf("results.json: no runs of %s at N=20", s)
			continue
		}
		if r := p.Runs[0]; r.Restored != 20 || r.Listed != 20 || r.Destroyed != 0 || r.ServingMs <= 0 {
			t.Errorf("%s at N=20: %+v, want 20 restored and listed, 0 destroyed", s, r)
		}
	}
	for _, s := range guestStrategies {
		p := res.find(s, 20)
		if !p.measured() {
			t.Errorf("results.json: no runs of %s at N=20", s)
			continue
		}
		r := p.Runs[0]
		if r.Restored != 20 || r.Listed != 20 || r.Destroyed != 0 || r.ServingMs <= 0 || r.InsideVerifiedMs <= 0 {
			t.Errorf("%s at N=20: %+v, want 20 restored and listed, 0 destroyed, verify-inside's end", s, r)
		}
		if r.PoliciesChecked != 20 || r.PoliciesKept != 20 || r.InsideSampled != guestSample || r.InsideKept != guestSample || r.InsideRepaired != 0 {
			t.Errorf("%s at N=20: policies %d/%d, samples %d/%d, repaired %d; want every one kept, nothing repaired (%q)",
				s, r.PoliciesKept, r.PoliciesChecked, r.InsideKept, r.InsideSampled, r.InsideRepaired, r.PolicyDiffs)
		}
	}
	for _, s := range datapathStrategies {
		p := res.find(s, 20)
		if !p.measured() {
			t.Errorf("results.json: no runs of %s at N=20", s)
			continue
		}
		if r := p.Runs[0]; r.Restored != 20 || r.Listed != 20 || r.DatapathKept != 20 || r.Destroyed != 0 || r.ServingMs <= 0 {
			t.Errorf("%s at N=20: %+v, want 20 restored and listed with their port and limits, 0 destroyed", s, r)
		}
	}
}

// checkSmokeLoad checks the load part: every kind sampled while idle and
// after a start, the control server answering every check, the checker
// rates recorded; and the exec floor measured once.
func checkSmokeLoad(t *testing.T, res *Results) {
	t.Helper()
	if l := res.Load; l == nil || len(l.Runs) != 1 || len(l.Runs[0].Series) == 0 {
		t.Errorf("results.json: load part: %+v", res.Load)
	} else {
		// Every kind in the idle second (10 Acquires at 10/s); health
		// checks (2,000/s) in the window after a start too, which is as
		// short as the reclaim: an Acquire may miss it.
		for _, k := range []string{kindGRPC, kindHTTP, kindAcquire} {
			if l.Idle[k].Requests == 0 {
				t.Errorf("results.json: no %s samples while idle: %+v", k, l)
			}
		}
		for _, k := range []string{kindGRPC, kindHTTP} {
			if l.Start[k].Requests == 0 {
				t.Errorf("results.json: no %s samples after a start: %+v", k, l)
			}
			// The control server, probed in the same seconds as the
			// reclaiming daemon, answered every check it was sent.
			if c := l.Control[k]; c.Requests == 0 || c.Errors != 0 {
				t.Errorf("results.json: control server's %s checks during the reclaim: %+v", k, c)
			}
		}
		if _, ok := l.Control[kindAcquire]; ok {
			t.Error("results.json: the control server has Acquire samples; only the daemon serves Acquire")
		}
		if c := l.Checker; c == nil || c.HTTPRate != checkerHTTPRate || c.GRPCRate != checkerGRPCRate || len(c.WindowMs) != 1 {
			t.Errorf("results.json: checker-rate run: %+v", l.Checker)
		}
	}
	if len(res.ExecMs) != 1 {
		t.Errorf("results.json: exec floor %v, want one per rep", res.ExecMs)
	}
}

// checkSmokeAcquireAndUpgrade checks the Acquire comparison, the slot
// rate (every burst answered) and the upgrade scenarios (every probe
// classified, every lease restored).
func checkSmokeAcquireAndUpgrade(t *testing.T, res *Results) {
	t.Helper()
	if a := res.Acquire; a == nil || len(a.Durable.Runs) != 1 || len(a.Memory.Runs) != 1 ||
		a.Durable.Latency.Requests != 40 || a.Memory.Latency.Requests != 40 {
		t.Errorf("results.json: Acquire comparison: %+v", res.Acquire)
	}
	if s := res.SlotRate; s == nil || len(s.Library) != 1 || len(s.Daemon) != len(slotRateCallers) {
		t.Errorf("results.json: slot rate: %+v", res.SlotRate)
	} else {
		for _, d := range s.Daemon {
			if len(d.PerS) != 1 || d.Latency.Requests != 20 || d.Latency.Errors != 0 {
				t.Errorf("slot rate with %d callers: %+v, want one burst of 20 answered", d.Callers, d)
			}
		}
	}
	if u := res.Upgrade; u == nil || len(u.Scenarios) != 3 {
		t.Errorf("results.json: upgrade scenarios: %+v", res.Upgrade)
	} else {
		for _, s := range u.Scenarios {
			if s.Probes == 0 || s.Probes != s.Serving+s.NotServing+s.Refused+s.Failed || len(s.Series) == 0 {
				t.Errorf("scenario %q: probes not all classified: %+v", s.Name, s)
			}
			if s.Restored != 4 || s.Destroyed != 0 {
				t.Errorf("scenario %q: %d leases restored, %d destroyed; want 4 and 0", s.Name, s.Restored, s.Destroyed)
			}
		}
	}
}

// checkSmokeFlood checks the flood part: both windows probed, health and
// Acquire; nobody held some connections and was refused others.
func checkSmokeFlood(t *testing.T, res *Results) {
	t.Helper()
	if f := res.Flood; f == nil || len(f.Runs) != 1 {
		t.Errorf("results.json: flood part: %+v", res.Flood)
	} else {
		// Both windows probed, health and Acquire; nobody held some
		// connections and was refused others (its bound per peer).
		for _, k := range []string{kindGRPC, kindHTTP, kindAcquire} {
			if f.Quiet[k].Requests == 0 || f.Flood[k].Requests == 0 || f.Elsewhere[k].Requests == 0 {
				t.Errorf("results.json: flood part: no %s samples in a window: quiet %+v, flooded %+v, elsewhere %+v",
					k, f.Quiet[k], f.Flood[k], f.Elsewhere[k])
			}
		}
		// The sink refuses everything; the port holds nobody's bound.
		if r := f.Runs[0]; r.Report.Held == 0 || r.Report.Refused == 0 || r.MaxFDs == 0 || r.Sink.Held != 0 || r.Sink.Refused == 0 {
			t.Errorf("results.json: flood part: the flood %+v, the daemon's descriptors %d, the flood elsewhere %+v", r.Report, r.MaxFDs, r.Sink)
		}
	}
}

// checkSmokeAB checks part ab, A/A (no -ab-binary): both sides started,
// timed and probed, plain and over TLS, every check answered.
func checkSmokeAB(t *testing.T, res *Results) {
	t.Helper()
	if ab := res.AB; ab == nil || len(ab.Runs) != 4 || len(ab.Windows) != 4 || len(ab.Checks) != 4 {
		t.Errorf("results.json: ab part: %+v", res.AB)
	} else {
		for _, r := range ab.Runs {
			if r.FirstAnswerMs <= 0 || r.ServingMs < r.FirstAnswerMs {
				t.Errorf("ab start %+v: no times", r)
			}
		}
		for _, c := range ab.Checks {
			for _, st := range c.Side {
				if st.Requests == 0 || st.Errors != 0 {
					t.Errorf("ab checks %s at %d/s, TLS %v: %+v", c.Kind, c.Rate, c.TLS, st)
				}
			}
		}
	}
}
