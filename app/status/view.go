package status

import (
	"encoding/json"
	"math"
	"net/http"
	"time"

	"github.com/phasegate/phasegate/lifecycle"
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
}

// NewView converts a snapshot, with the rates and times left it carries.
func NewView(s lifecycle.Snapshot) View {
	v := View{State: s.State, Since: s.Since, Started: s.Started, Degraded: s.Degraded, Error: errString(s.Err)}
	for _, p := range s.Phases {
		v.Phases = append(v.Phases, PhaseView{
			Name: p.Name, DependsOn: p.DependsOn, State: string(p.State), Attempts: p.Attempts,
			Started: p.Started, Ended: p.Ended, Duration: p.Duration(), Progress: p.Progress, Error: errString(p.Err),
		})
		v.Phases[len(v.Phases)-1].setEstimate(p.ETA)
	}
	for _, t := range s.Tasks {
		v.Tasks = append(v.Tasks, PhaseView{
			Name: t.Name, Phase: t.Phase, State: string(t.State),
			Started: t.Started, Ended: t.Ended, Duration: t.Duration(), Progress: t.Progress, Error: errString(t.Err),
		})
		v.Tasks[len(v.Tasks)-1].setEstimate(t.ETA)
	}
	return v
}

func (p *PhaseView) setEstimate(e lifecycle.Estimate) {
	p.Rate = math.Round(e.Rate*100) / 100
	if e.OK {
		p.ETA = e.Remaining
	}
}

// Handler serves the lifecycle's current View, with the rates and times
// left its snapshot carries.
func Handler(lc *lifecycle.Lifecycle) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(NewView(lc.Snapshot()))
	})
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
