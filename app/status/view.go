package status

import (
	"encoding/json"
	"math"
	"net/http"
	"time"

	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/lifecycle/history"
)

// View is the JSON form of a lifecycle snapshot an App serves at
// /debug/lifecycle: phases in declaration order, which the health body (a
// map) cannot keep. [Fetch] reads it.
type View struct {
	State    lifecycle.State `json:"state"`
	Since    time.Time       `json:"since"`
	Started  time.Time       `json:"started,omitzero"`
	Degraded bool            `json:"degraded,omitempty"`
	Error    string          `json:"error,omitempty"`
	Phases   []PhaseView     `json:"phases"`
	Tasks    []PhaseView     `json:"tasks,omitempty"`
}

// PhaseView is one phase or background task in a [View].
type PhaseView struct {
	Name      string                     `json:"name"`
	Phase     string                     `json:"phase,omitempty"` // tasks: the phase that deferred it
	DependsOn []string                   `json:"dependsOn,omitempty"`
	State     string                     `json:"state"`
	Attempts  int                        `json:"attempts,omitempty"`
	Started   time.Time                  `json:"started,omitzero"`
	Ended     time.Time                  `json:"ended,omitzero"`
	Duration  time.Duration              `json:"durationNs"`
	Progress  lifecycle.ProgressSnapshot `json:"progress"`
	// Rate is units of progress per second (recent while running, the
	// average once done); ETA the estimated time left while running.
	Rate  float64       `json:"rate,omitempty"`
	ETA   time.Duration `json:"etaNs,omitempty"`
	Error string        `json:"error,omitempty"`
	// Usual is what the step usually takes, from the App's start history
	// ("usually 68ms (47ms–76ms) over the last 5 starts, ~10
	// namespaces"); Slow marks it much slower than that this time.
	Usual string `json:"usual,omitempty"`
	Slow  bool   `json:"slow,omitempty"`
	// WorstCase is, for a phase, the longest it can run before it fails
	// for good (lifecycle.Phase.WorstCase); zero when nothing bounds it.
	WorstCase time.Duration `json:"worstCaseNs,omitempty"`
}

// UsualFunc says what a phase, or with task a background task, usually
// takes: an App's start history (package lifecycle/history).
type UsualFunc func(name string, task bool) (history.Usual, bool)

// NewView converts a snapshot, with the rates and times left it carries,
// and each step's usual when usual is not nil.
func NewView(s lifecycle.Snapshot, usual UsualFunc) View {
	v := View{State: s.State, Since: s.Since, Started: s.Started, Degraded: s.Degraded, Error: errString(s.Err)}
	for _, p := range s.Phases {
		v.Phases = append(v.Phases, PhaseView{
			Name: p.Name, DependsOn: p.DependsOn, State: string(p.State), Attempts: p.Attempts,
			Started: p.Started, Ended: p.Ended, Duration: p.Duration(), Progress: p.Progress, Error: errString(p.Err),
			WorstCase: p.WorstCase,
		})
		v.Phases[len(v.Phases)-1].setEstimate(p.ETA)
		v.Phases[len(v.Phases)-1].setUsual(usual, false)
	}
	for _, t := range s.Tasks {
		v.Tasks = append(v.Tasks, PhaseView{
			Name: t.Name, Phase: t.Phase, State: string(t.State),
			Started: t.Started, Ended: t.Ended, Duration: t.Duration(), Progress: t.Progress, Error: errString(t.Err),
		})
		v.Tasks[len(v.Tasks)-1].setEstimate(t.ETA)
		v.Tasks[len(v.Tasks)-1].setUsual(usual, true)
	}
	return v
}

func (p *PhaseView) setEstimate(e lifecycle.Estimate) {
	p.Rate = math.Round(e.Rate*100) / 100
	if e.OK {
		p.ETA = e.Remaining
	}
}

// setUsual adds what the step usually takes, once it started.
func (p *PhaseView) setUsual(usual UsualFunc, task bool) {
	if usual == nil || p.Started.IsZero() {
		return
	}
	if u, ok := usual(p.Name, task); ok {
		p.Usual, p.Slow = u.String(), u.Slow(p.Duration)
	}
}

// Handler serves the lifecycle's current View, with the rates and times
// left its snapshot carries, and each step's usual when usual is not nil.
func Handler(lc *lifecycle.Lifecycle, usual UsualFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(NewView(lc.Snapshot(), usual))
	})
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
