package health_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/phasegate/phasegate/health"
	"github.com/phasegate/phasegate/health/internal/healthtest"
	"github.com/phasegate/phasegate/internal/longbody"
)

// consulOutputMax is what Consul's agent keeps of an HTTP check's body by
// default (check_output_max_size): the last 4 KiB, in a circular buffer.
const consulOutputMax = 4096

// A /health body longer than a checker's window (many phases, long
// warnings) still shows status and output whether the checker keeps its
// start (as most do) or its end (as Consul does): the verdict leads the
// body and is repeated, output then status, at its end.
func TestHealthVerdictSurvivesCut(t *testing.T) {
	lc := longbody.Start(t)
	c := health.New(lc, health.Options{Version: "1.2.3"})
	t.Cleanup(c.Close)
	h := health.NewHandler(c)

	var body string
	healthtest.Eventually(t, "every quick phase done and the body past 4 KiB", func() bool {
		w := get(h, http.MethodGet, health.PathHealth)
		body = w.Body.String()
		doc := decodeHealth(t, w)
		done := 0
		for _, ch := range doc.Checks {
			if len(ch) == 1 && ch[0].State == "succeeded" {
				done++
			}
		}
		return w.Code == http.StatusServiceUnavailable && done == longbody.Phases && len(body) > 2*consulOutputMax
	})
	const wantOutput = "starting: phase slow"

	// Consul's cut: the last 4 KiB. The verdict is the last object.
	tail := body[len(body)-consulOutputMax:]
	i := strings.LastIndex(tail, `"verdict":`)
	if i < 0 {
		t.Fatalf("the last 4 KiB have no verdict:\n%s", tail)
	}
	var v struct{ Status, Output string }
	if err := json.NewDecoder(strings.NewReader(tail[i+len(`"verdict":`):])).Decode(&v); err != nil {
		t.Fatalf("verdict in the last 4 KiB: %v\n%s", err, tail[i:])
	}
	if v.Status != "fail" || !strings.HasPrefix(v.Output, wantOutput) {
		t.Errorf("verdict in the last 4 KiB: status %q output %q, want fail, %q…", v.Status, v.Output, wantOutput)
	}
	if !strings.HasSuffix(strings.TrimSpace(tail), `"status":"fail"}}`) {
		t.Errorf("the body does not end with the verdict's status: …%s", tail[len(tail)-80:])
	}

	// A cut that keeps the start: status and output lead.
	head := body[:consulOutputMax]
	if !strings.HasPrefix(head, `{"status":"fail",`) || !strings.Contains(head, `"output":"`+wantOutput) {
		t.Errorf("the first 4 KiB do not lead with status and output:\n%.300s", head)
	}

	// ?pretty is the same document, indented.
	w := get(h, http.MethodGet, health.PathHealth+"?pretty")
	var pretty struct {
		Status  string
		Verdict struct{ Status, Output string }
	}
	if err := json.Unmarshal(w.Body.Bytes(), &pretty); err != nil || pretty.Status != "fail" || pretty.Verdict.Status != "fail" {
		t.Errorf("?pretty: %v: status %q verdict %+v", err, pretty.Status, pretty.Verdict)
	}
}
