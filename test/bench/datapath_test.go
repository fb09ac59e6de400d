package main

import "testing"

// The ports+limits goal compares each restart's median SERVING with the
// plain variant's at the same N, and counts the leases listed with their
// port and limits; without the variant it is not measured.
func TestDatapathRestoreGoal(t *testing.T) {
	plain := Run{ServingMs: 100, Restored: 1000, Listed: 1000}
	good := Run{ServingMs: 105, Restored: 1000, Listed: 1000, DatapathKept: 1000}
	tests := []struct {
		name string
		run  func(Run) Run
		want string
	}{
		{"within 1.1x", func(r Run) Run { return r }, goalMet},
		{"1.2x plain", func(r Run) Run { r.ServingMs = 120; return r }, goalMissed},
		{"a lease listed without its port", func(r Run) Run { r.DatapathKept = 999; return r }, goalMissed},
		{"a slot destroyed", func(r Run) Run { r.Destroyed = 1; return r }, goalMissed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := &Results{}
			res.point(stratRestoreTerm, 1000).Runs = []Run{plain}
			res.point(stratRestoreKill, 1000).Runs = []Run{plain}
			res.point(stratDatapathTerm, 1000).Runs = []Run{tt.run(good)}
			res.point(stratDatapathKill, 1000).Runs = []Run{good}
			res.evaluate()
			if g := datapathRestoreGoal(res); g.Status != tt.want {
				t.Errorf("goal %q (%s; %s), want %q", g.Status, g.Measured, g.Note, tt.want)
			}
		})
	}
	res := &Results{}
	res.point(stratDatapathTerm, 1000).Runs = []Run{good}
	res.evaluate()
	if g := datapathRestoreGoal(res); g.Status != goalMissed {
		t.Errorf("without a plain run to compare with: %q (%s)", g.Status, g.Note)
	}
	if g := datapathRestoreGoal(&Results{}); g.Status != goalNotMeasured {
		t.Errorf("without the variant: %q", g.Status)
	}
}
