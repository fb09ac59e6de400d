package main

import (
	"encoding/json"
	"fmt"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSmoke builds the benchmark, runs it as a user would with a tiny N
// (one rep, every strategy, the latency measurement) and checks what it
// writes: the JSON has the three strategies with measured points, and the
// PNGs decode. It asserts no timing: the figures of a 20-slot run on a
// shared machine mean nothing.
func TestSmoke(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("PHASEGATE_REQUIRE_TOOLS") == "1" {
			t.Fatal("the benchmark needs root")
		}
		t.Skip("the benchmark needs root")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "bench")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out := filepath.Join(dir, "out")
	doc := filepath.Join(dir, "BENCHMARKS.md")
	if err := os.WriteFile(doc, []byte("# B\n\nbefore\n"+docStart+"\nold\n"+docEnd+"\nafter\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-n", "0,20", "-reps", "1", "-load-n", "20", "-load-reps", "1",
		"-idle-duration", "500ms", "-settle", "200ms", "-out", out, "-doc", doc)
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

	res := readResults(t, filepath.Join(out, "results.json"))
	for _, s := range []string{stratPhasegate, stratSerial, stratFloor} {
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
		}
	}
	if res.Load == nil || res.Load.Idle[kindGRPC].Requests == 0 || res.Load.Idle[kindHTTP].Requests == 0 {
		t.Errorf("results.json: no idle latency samples: %+v", res.Load)
	}
	if len(res.Goals) == 0 {
		t.Error("results.json: no goals evaluated")
	}
	for _, name := range []string{"answer.png", "serving.png", "timeline.png", "timeline-serial.png"} {
		checkPNG(t, filepath.Join(out, name))
	}
	b, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	if s := string(b); strings.Contains(s, "\nold\n") || !strings.Contains(s, "serving.png") ||
		!strings.HasPrefix(s, "# B\n\nbefore\n") || !strings.HasSuffix(s, docEnd+"\nafter\n") {
		t.Errorf("-doc section not replaced as expected:\n%s", s)
	}
}

func readResults(t *testing.T, file string) *Results {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var res Results
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return &res
}

func checkPNG(t *testing.T, file string) {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Error(err)
		return
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Errorf("%s: %v", file, err)
		return
	}
	if b := img.Bounds(); b.Dx() < 100 || b.Dy() < 100 {
		t.Errorf("%s: only %v", file, b)
	}
}

// TestParseNs covers the -n list and -skip-10k.
func TestParseNs(t *testing.T) {
	for _, c := range []struct {
		in      string
		skip10k bool
		want    string
		err     bool
	}{
		{"0,1000,5000,10000", false, "[0 1000 5000 10000]", false},
		{"10000, 0,1000,1000", true, "[0 1000]", false},
		{"10000", true, "", true},
		{"x", false, "", true},
		{"-1", false, "", true},
		{"99999", false, "", true},
	} {
		got, err := parseNs(c.in, c.skip10k)
		if (err != nil) != c.err {
			t.Errorf("parseNs(%q, %v): error %v", c.in, c.skip10k, err)
			continue
		}
		if err == nil {
			if s := fmt.Sprint(got); s != c.want {
				t.Errorf("parseNs(%q, %v) = %s, want %s", c.in, c.skip10k, s, c.want)
			}
		}
	}
}

// TestSummaryAndPercentile checks the statistics the report rests on.
func TestSummaryAndPercentile(t *testing.T) {
	s := summarize([]float64{3, 1, 2, 10})
	if s.Median != 2.5 || s.Min != 1 || s.Max != 10 || s.Count != 4 {
		t.Errorf("summarize = %+v", s)
	}
	sorted := make([]float64, 100)
	for i := range sorted {
		sorted[i] = float64(i + 1)
	}
	if p := percentile(sorted, 0.99); p != 99 {
		t.Errorf("p99 of 1..100 = %v, want 99", p)
	}
	if p := percentile(sorted, 0.5); p != 50 {
		t.Errorf("p50 of 1..100 = %v, want 50", p)
	}
}

// TestGoalsNeverMeasuredFromExtrapolation: a serial point that was skipped
// and extrapolated never yields met or missed.
func TestGoalsNeverMeasuredFromExtrapolation(t *testing.T) {
	res := &Results{Settings: Settings{Ns: []int{5000}, PoolSize: 16}}
	pg := res.point(stratPhasegate, 5000)
	pg.Runs = []Run{{ServingMs: 2000}}
	pg.summarizeRuns()
	se := res.point(stratSerial, 5000)
	se.Skipped = "N > -serial-max 1000"
	se.Extrapolated = &Extrapolation{ServingMs: 270000}
	g := serialSpeedupGoal(res)
	if g.Status != goalNotMeasured || !strings.Contains(g.Note, "not a measurement") {
		t.Errorf("goal from an extrapolation = %+v", g)
	}
}
