package test

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// slowDead is how many dead slots the slow start reclaims: enough that
// its reclaim is "much slower than usual" (at least 3 times the median and
// half a second more) on a quick machine too, where 2,000 took 483 ms
// against a usual 73 ms (6.6 times, but 410 ms more).
const slowDead = 3800

// The start history end to end, as an operator meets it: the daemon is
// started five times with ~10 dead slots to reclaim and a sixth time with
// slowDead. The sixth start's reclaim of the dead is flagged: in the log
// ("task slower than usual", naming the task, its figure and the usual),
// in /health beside its duration, in `phasegate status`, on the timeline,
// in the metric, and on its span in Jaeger. The five usual starts flag
// nothing, and every start is kept in the state directory's history.
func TestStartHistoryFlagsTheSlowStart(t *testing.T) {
	jaeger := startJaeger(t)
	h := newHost(t)
	addr := freePort(t)
	service := "phasegate-history-" + h.prefix
	for i := range 6 {
		dead := 10
		var env []string
		if i == 5 {
			dead = slowDead
			env = []string{
				"OTEL_TRACES_EXPORTER=otlp",
				"OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
				"OTEL_EXPORTER_OTLP_ENDPOINT=http://" + jaeger.otlpHTTP,
				"OTEL_SERVICE_NAME=" + service,
			}
		}
		if n := h.leak(h.prefix, 100, dead); n != dead {
			t.Fatalf("start %d: leaked %d dead slots, want %d", i+1, n, dead)
		}
		began := time.Now()
		d := start(t, env, h.args(addr)...)
		d.waitReclaimed(3 * time.Minute)
		if i < 5 {
			if strings.Contains(d.Output(), "slower than usual") {
				t.Fatalf("start %d of the usual 10 dead slots flagged slow:\n%s", i+1, d.Output())
			}
		} else {
			checkFlaggedSlow(t, d)
		}
		d.signal(syscall.SIGTERM)
		if code := d.wait(time.Minute); code != 0 {
			t.Fatalf("start %d: exit %d", i+1, code)
		}
		if i == 5 {
			checkSpanFlaggedSlow(t, jaeger, service, began)
		}
	}
	var kept struct {
		Starts []struct {
			Outcome string `json:"outcome"`
		} `json:"starts"`
	}
	b := run(t, "cat", h.stateDir+"/starts.json")
	if err := json.Unmarshal([]byte(b), &kept); err != nil || len(kept.Starts) != 6 {
		t.Errorf("the state directory's history: %v, %d starts, want 6", err, len(kept.Starts))
	}
	h.decommission(h.prefix)
}

// checkFlaggedSlow checks every view of d flags its reclaim of the dead as
// slower than usual.
func checkFlaggedSlow(t *testing.T, d *daemon) {
	t.Helper()
	// Logged as the task ends, a moment after the lifecycle says so.
	waitFor(t, 30*time.Second, "the slow reclaim logged", func() bool {
		return strings.Contains(d.Output(), `msg="task slower than usual" task=reclaim-dead`)
	})
	out := d.Output()
	if !strings.Contains(out, "over the last 5 starts, ~10 namespaces") || !strings.Contains(out, fmt.Sprintf(`progress="%d/%d namespaces`, slowDead, slowDead)) {
		t.Errorf("the log does not flag the reclaim of %d dead slots, with its figures, against the last 5 starts:\n%s", slowDead, out)
	}
	_, body, err := d.get("/health")
	if err != nil {
		t.Fatal(err)
	}
	var health struct {
		Checks map[string][]struct {
			Duration string `json:"duration"`
			Usual    string `json:"usual"`
			Slow     bool   `json:"slow"`
		} `json:"checks"`
	}
	if err := json.Unmarshal([]byte(body), &health); err != nil {
		t.Fatal(err)
	}
	if c := health.Checks["task:reclaim-dead"]; len(c) != 1 || !c[0].Slow || !strings.HasPrefix(c[0].Usual, "usually ") {
		t.Errorf("/health's check of the reclaim: %+v, want it slow, beside its usual\n%s", c, body)
	} else {
		t.Logf("/health: reclaim-dead %s, %s", c[0].Duration, c[0].Usual)
	}
	// The CLI as the README shows it: status names the reclaim slower than
	// usual, beside the usual figure.
	cli, err := exec.Command(binary, "status", "--addr", d.addr).CombinedOutput()
	if err != nil || !strings.Contains(string(cli), "SLOWER THAN USUAL: usually") {
		t.Errorf("phasegate status: %v\n%s", err, cli)
	}
	if _, page, err := d.get("/debug/startup"); err != nil || !strings.Contains(page, "slower than usual") {
		t.Errorf("the timeline does not mark the reclaim slower than usual (%v)", err)
	}
	if _, m, err := d.get("/metrics"); err != nil || !strings.Contains(m, `phasegate_start_slow_steps_total{kind="task"`) || !strings.Contains(m, `step="reclaim-dead"`) {
		t.Errorf("the metric does not count the slow reclaim (%v)", err)
	}
}

// checkSpanFlaggedSlow reads the slow start's reclaim of the dead back
// from Jaeger: its span says it was slower than usual, and what is usual.
func checkSpanFlaggedSlow(t *testing.T, j *jaeger, service string, since time.Time) {
	t.Helper()
	var task otlpSpan
	waitFor(t, 30*time.Second, "the reclaim's span in jaeger", func() bool {
		spans, err := j.spans(service, since)
		if err != nil {
			t.Logf("jaeger: %v", err)
			return false
		}
		for _, s := range spans {
			if s.Name == "task reclaim-dead" {
				task = s
				return true
			}
		}
		return false
	})
	slow, _ := task.attr("phasegate.slower_than_usual")
	usual, _ := task.attr("phasegate.usual")
	if slow != "true" || !strings.Contains(usual, "over the last 5 starts, ~10 namespaces") {
		t.Errorf("the reclaim's span: slower_than_usual %q, usual %q; want true, beside the last 5 starts' usual", slow, usual)
	} else {
		t.Logf("jaeger: span %q: slower_than_usual %s, %s", task.Name, slow, usual)
	}
}
