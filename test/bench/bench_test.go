package main

import (
	"fmt"
	"image/png"
	"io"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
)

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
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
	res := &Results{}
	bg := res.point(stratBackground, 5000)
	bg.Runs = []Run{{ServingMs: 200}}
	se := res.point(stratSerial, 5000)
	se.Skipped = "N > -serial-max 1000"
	se.Extrapolated = &Extrapolation{ServingMs: 270000}
	res.evaluate()
	if g := serialGoal(res); g.Status != goalNotMeasured {
		t.Errorf("goal from an extrapolation = %+v", g)
	}
}

// TestClassify checks how probes are counted: every probe in exactly one
// outcome, refused apart from other failures, and in its 100 ms bucket.
func TestClassify(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(d time.Duration) int64 { return t0.Add(d).UnixNano() }
	samples := []sample{
		{Kind: kindHTTP, At: at(10 * time.Millisecond), Answer: "200", Latency: int64(time.Millisecond)},
		{Kind: kindGRPC, At: at(20 * time.Millisecond), Answer: "SERVING", Latency: int64(2 * time.Millisecond)},
		{Kind: kindGRPC, At: at(150 * time.Millisecond), Answer: "NOT_SERVING", Latency: int64(time.Millisecond)},
		{Kind: kindHTTP, At: at(160 * time.Millisecond), Answer: "503", Latency: int64(time.Millisecond)},
		{Kind: kindHTTP, At: at(250 * time.Millisecond), Err: "dial tcp: connect: connection refused", Out: outRefused},
		{Kind: kindGRPC, At: at(260 * time.Millisecond), Err: "context deadline exceeded", Out: outFailed},
	}
	var sc Scenario
	classify(&sc, samples, t0)
	if sc.Probes != 6 || sc.Serving != 2 || sc.NotServing != 2 || sc.Refused != 1 || sc.Failed != 1 {
		t.Errorf("totals: %+v", sc)
	}
	want := []Bucket{{Serving: 2, MaxMs: 2}, {NotServing: 2, MaxMs: 1}, {Refused: 1, Failed: 1}}
	if fmt.Sprint(sc.Series) != fmt.Sprint(want) {
		t.Errorf("series = %+v, want %+v", sc.Series, want)
	}
	if sc.FirstError != "context deadline exceeded" {
		t.Errorf("first error %q, want the first failure that is not a refusal", sc.FirstError)
	}
}

// TestParseParts keeps the running order whatever the order asked, and
// refuses unknown parts.
func TestParseParts(t *testing.T) {
	got, err := parseParts("upgrade, dead")
	if err != nil || fmt.Sprint(got) != "[dead upgrade]" {
		t.Errorf("parseParts = %v, %v", got, err)
	}
	if _, err := parseParts("dead,nope"); err == nil {
		t.Error("parseParts accepted an unknown part")
	}
}

// TestDropPart: measuring a part again replaces what it measured and
// nothing else.
func TestDropPart(t *testing.T) {
	res := &Results{Parts: map[string]*Part{partDead: {}, partRestore: {}}, Load: &LoadResult{}}
	res.point(stratBackground, 10).Runs = []Run{{}}
	res.point(stratRestoreKill, 10).Runs = []Run{{}}
	res.point(stratGuestKill, 10).Runs = []Run{{}}
	res.Leasing = []LeaseSetup{{N: 10, Guest: true}}
	res.dropPart(partDead)
	if res.find(stratBackground, 10) != nil || !res.find(stratRestoreKill, 10).measured() || res.Load == nil {
		t.Errorf("after dropping part dead: %+v", res.Points)
	}
	if _, ok := res.Parts[partDead]; ok || res.Parts[partRestore] == nil {
		t.Errorf("parts after the drop: %v", res.Parts)
	}
	if !res.find(stratGuestKill, 10).measured() {
		t.Error("dropping part dead dropped the guest+policy restore")
	}
	res.dropPart(partRestore)
	if res.find(stratRestoreKill, 10) != nil || res.find(stratGuestKill, 10) != nil || res.Leasing != nil {
		t.Errorf("after dropping part restore: %+v, leasing %+v", res.Points, res.Leasing)
	}
}

// The slot-rate goal holds only when every number of callers reaches the
// ratio against the library's median, with no error.
func TestSlotRateGoal(t *testing.T) {
	side := func(callers int, perS float64, errs int) SlotRateSide {
		return SlotRateSide{Callers: callers, PerS: []float64{perS}, Latency: LatencyStats{Errors: errs}}
	}
	tests := []struct {
		name string
		res  *SlotRateResult
		want string
	}{
		{"not run", nil, goalNotMeasured},
		{"both at 0.9×", &SlotRateResult{Library: []float64{400}, Daemon: []SlotRateSide{side(1, 360, 0), side(16, 380, 0)}}, goalMet},
		{"one caller short", &SlotRateResult{Library: []float64{400}, Daemon: []SlotRateSide{side(1, 300, 0), side(16, 380, 0)}}, goalMissed},
		{"fast but with errors", &SlotRateResult{Library: []float64{400}, Daemon: []SlotRateSide{side(1, 400, 2), side(16, 400, 0)}}, goalMissed},
		{"median of the library's reps", &SlotRateResult{Library: []float64{100, 400, 1000}, Daemon: []SlotRateSide{side(1, 330, 0), side(16, 330, 0)}}, goalMet},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := slotRateGoal(&Results{SlotRate: tt.res})
			if g.Status != tt.want {
				t.Errorf("status %q (%s; %s), want %q", g.Status, g.Measured, g.Note, tt.want)
			}
		})
	}
}

// TestGuestOptions: -restore-guest is on by default, -guest-addr must
// leave room for the tap's address and stay out of -cidr, and is checked
// only when the restore part runs.
func TestGuestOptions(t *testing.T) {
	for _, tt := range []struct {
		name  string
		args  []string
		guest bool
		err   bool
	}{
		{"defaults", nil, true, false},
		{"off", []string{"-restore-guest=false"}, false, false},
		{"README's guest network outside -cidr", []string{"-guest-addr", "169.254.0.21/30", "-cidr", "169.254.128.0/17"}, true, false},
		{"inside -cidr", []string{"-guest-addr", "169.254.0.21/30"}, true, true},
		{"inside -cidr, restore not run", []string{"-guest-addr", "169.254.0.21/30", "-parts", "dead"}, true, false},
		{"inside -cidr, variant off", []string{"-guest-addr", "169.254.0.21/30", "-restore-guest=false"}, false, false},
		{"the tap would be the broadcast", []string{"-guest-addr", "10.9.0.22/30"}, true, true},
		{"the network's own address", []string{"-guest-addr", "10.9.0.20/30"}, true, true},
		{"a /31", []string{"-guest-addr", "10.9.0.20/31"}, true, true},
		{"IPv6", []string{"-guest-addr", "fd00::21/126"}, true, true},
		{"not a prefix", []string{"-guest-addr", "10.9.0.21"}, true, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			o, err := parseOptions(tt.args, io.Discard)
			if (err != nil) != tt.err {
				t.Fatalf("parseOptions(%q): error %v, want error %v", tt.args, err, tt.err)
			}
			if err == nil && o.restoreGuest != tt.guest {
				t.Errorf("restoreGuest = %v, want %v", o.restoreGuest, tt.guest)
			}
		})
	}
}

// TestGuestArgs: the daemon gets the guest profile with the tap at the
// address after the guest's, and a proxy port it lets slots reach.
func TestGuestArgs(t *testing.T) {
	got := strings.Join(guestArgs(netip.MustParsePrefix("169.254.0.21/30")), " ")
	for _, want := range []string{"--slot-guest-tap=tap0", "--slot-guest-addr=169.254.0.21/30", "--slot-guest-gateway=169.254.0.22",
		"--slot-egress-proxy-port=3128", "--slot-host-tcp-ports=3128"} {
		if !strings.Contains(got, want) {
			t.Errorf("guestArgs = %q, lacks %q", got, want)
		}
	}
}

// TestGuestPolicy: the mix the report states — deny_all every 8th lease,
// redirect_tcp every 4th offset by one, never both, and per-lease CIDRs
// that differ between leases and that the daemon's rules accept (IPv4,
// no host bits, no overlap within a list).
func TestGuestPolicy(t *testing.T) {
	denyAll, redirect := 0, 0
	seen := map[string]bool{}
	for k := 1; k <= 64; k++ {
		p := guestPolicy(k)
		if p.GetDenyAll() {
			denyAll++
			if p.GetRedirectTcp() || len(p.GetAllow())+len(p.GetDeny()) > 0 {
				t.Errorf("lease %d: deny_all with more: %v", k, p)
			}
			continue
		}
		if p.GetRedirectTcp() {
			redirect++
		}
		seen[canonicalPolicy(p)] = true
		for _, list := range [][]string{p.GetAllow(), p.GetDeny()} {
			var ps []netip.Prefix
			for _, s := range list {
				pr, err := netip.ParsePrefix(s)
				if err != nil || pr.Masked() != pr || !pr.Addr().Is4() {
					t.Fatalf("lease %d: %q is not an IPv4 CIDR without host bits", k, s)
				}
				for _, q := range ps {
					if q.Overlaps(pr) {
						t.Errorf("lease %d: %s overlaps %s", k, q, pr)
					}
				}
				ps = append(ps, pr)
			}
		}
	}
	if denyAll != 64/guestDenyAllEvery || redirect != 64/guestRedirectEvery {
		t.Errorf("%d deny_all and %d redirect_tcp in 64 leases", denyAll, redirect)
	}
	if len(seen) != 64-denyAll {
		t.Errorf("%d distinct policies in %d leases without deny_all", len(seen), 64-denyAll)
	}
}

// TestPolicyMismatches: the same policy in another spelling or order is
// kept; a changed, dropped or unlisted one is reported, and slots of other
// leases are not counted.
func TestPolicyMismatches(t *testing.T) {
	slot := func(i int, p *phasegatev1.EgressPolicy) *phasegatev1.Slot {
		return &phasegatev1.Slot{Index: uint32(i), EgressPolicy: p}
	}
	want := map[int]string{
		1: canonicalPolicy(&phasegatev1.EgressPolicy{Allow: []string{"8.8.8.0/24", "1.1.1.1/32"}, Deny: []string{"52.0.0.0/11"}}),
		2: canonicalPolicy(&phasegatev1.EgressPolicy{DenyAll: true}),
		3: canonicalPolicy(&phasegatev1.EgressPolicy{Allow: []string{"1.1.1.1/32"}, RedirectTcp: true}),
		4: canonicalPolicy(&phasegatev1.EgressPolicy{Allow: []string{"1.1.1.1/32"}}),
	}
	got := []*phasegatev1.Slot{
		slot(1, &phasegatev1.EgressPolicy{Allow: []string{"1.1.1.1", "8.8.8.0/24"}, Deny: []string{"52.0.0.0/11"}}), // kept
		slot(2, &phasegatev1.EgressPolicy{DenyAll: false}),                                                          // changed
		slot(3, &phasegatev1.EgressPolicy{Allow: []string{"1.1.1.1/32"}}),                                           // redirect lost
		slot(9, nil), // not one of ours
	}
	checked, bad := policyMismatches(got, want)
	if checked != 3 {
		t.Errorf("checked %d, want 3", checked)
	}
	if len(bad) != 3 || !strings.HasPrefix(bad[0], "slot 2:") || !strings.HasPrefix(bad[1], "slot 3:") || bad[2] != "slot 4: not listed" {
		t.Errorf("mismatches %q, want slots 2 and 3 changed and 4 not listed", bad)
	}
	if _, bad := policyMismatches(got[:1], map[int]string{1: want[1]}); len(bad) != 0 {
		t.Errorf("the same policy respelled: %q", bad)
	}
}

// TestSampleIndices spreads the sample over the leases and keeps all of
// a short list.
func TestSampleIndices(t *testing.T) {
	all := make([]int, 100)
	for i := range all {
		all[i] = i + 1
	}
	if got := fmt.Sprint(sampleIndices(all, 4)); got != "[1 26 51 76]" {
		t.Errorf("sample of 100 = %s", got)
	}
	if got := fmt.Sprint(sampleIndices(all[:3], 16)); got != "[1 2 3]" {
		t.Errorf("sample of 3 = %s", got)
	}
}

// The guest goals: met only when SERVING, restored, lost and destroyed
// meet the restore goal and every policy and sample was kept with nothing
// repaired; not measured without the variant.
func TestGuestGoals(t *testing.T) {
	good := Run{ServingMs: 120, Restored: 1000, Listed: 1000, PoliciesChecked: 1000, PoliciesKept: 1000, InsideSampled: guestSample, InsideKept: guestSample}
	tests := []struct {
		name            string
		run             func(Run) Run
		restore, policy string
	}{
		{"all kept", func(r Run) Run { return r }, goalMet, goalMet},
		{"slow", func(r Run) Run { r.ServingMs = 250; return r }, goalMissed, goalMet},
		{"a lease lost", func(r Run) Run { r.Restored, r.Lost = 999, 1; return r }, goalMissed, goalMet},
		{"a slot destroyed", func(r Run) Run { r.Destroyed = 1; return r }, goalMissed, goalMet},
		{"a policy changed", func(r Run) Run { r.PoliciesKept = 999; r.PolicyDiffs = []string{"slot 7: …"}; return r }, goalMet, goalMissed},
		{"a sample rewritten", func(r Run) Run { r.InsideKept = guestSample - 1; return r }, goalMet, goalMissed},
		{"nothing sampled", func(r Run) Run { r.InsideSampled, r.InsideKept = 0, 0; return r }, goalMet, goalMissed},
		{"the daemon repaired one", func(r Run) Run { r.InsideRepaired = 1; return r }, goalMet, goalMissed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := &Results{}
			res.point(stratRestoreTerm, 1000).Runs = []Run{{ServingMs: 60, Restored: 1000, Listed: 1000}}
			res.point(stratGuestTerm, 1000).Runs = []Run{tt.run(good)}
			res.point(stratGuestKill, 1000).Runs = []Run{good}
			res.evaluate()
			if g := guestRestoreGoal(res); g.Status != tt.restore {
				t.Errorf("restore goal %q (%s; %s), want %q", g.Status, g.Measured, g.Note, tt.restore)
			}
			if g := policiesGoal(res); g.Status != tt.policy {
				t.Errorf("policies goal %q (%s; %s), want %q", g.Status, g.Measured, g.Note, tt.policy)
			}
			// The plain goal is the plain variant's alone.
			if g := restoreGoal(res); g.Status != goalMet {
				t.Errorf("plain restore goal %q (%s; %s)", g.Status, g.Measured, g.Note)
			}
		})
	}
	if g, p := guestRestoreGoal(&Results{}), policiesGoal(&Results{}); g.Status != goalNotMeasured || p.Status != goalNotMeasured {
		t.Errorf("without the variant: %q and %q", g.Status, p.Status)
	}
	res := &Results{}
	res.point(stratRestoreTerm, 1000).Runs = []Run{{ServingMs: 60, Restored: 1000, Listed: 1000}}
	res.point(stratGuestTerm, 1000).Runs = []Run{{ServingMs: 120, Restored: 1000, Listed: 1000}}
	res.evaluate()
	if g := guestRestoreGoal(res); !strings.Contains(g.Measured, "restore-guest-term N=1000: 2.00×") {
		t.Errorf("no ratio to the plain variant in %q", g.Measured)
	}
}

// The flood goals compare each kind's p99 with its p99 while the same
// flood hits another port, and count the flood's errors; without the part
// they are not measured.
func TestFloodGoal(t *testing.T) {
	st := func(p99 float64, errs int) LatencyStats {
		return LatencyStats{Requests: 100, P99Ms: p99, MaxMs: p99, Errors: errs, FirstError: "reset"}
	}
	for _, tc := range []struct {
		name             string
		elsewhere, flood LatencyStats
		want             string
	}{
		{"within", st(10, 0), st(14, 0), goalMet},
		{"over the ratio", st(10, 0), st(16, 0), goalMissed},
		{"errors", st(10, 0), st(10, 1), goalMissed},
	} {
		res := &Results{Flood: &FloodResult{
			Quiet:     map[string]LatencyStats{kindGRPC: st(1, 0), kindHTTP: st(1, 0), kindAcquire: st(1, 0)},
			Elsewhere: map[string]LatencyStats{kindGRPC: st(10, 0), kindHTTP: st(10, 0), kindAcquire: tc.elsewhere},
			Flood:     map[string]LatencyStats{kindGRPC: st(10, 0), kindHTTP: st(10, 0), kindAcquire: tc.flood},
		}}
		if g := floodGoal(res, []string{kindAcquire}); g.Status != tc.want {
			t.Errorf("%s: %+v, want %s", tc.name, g, tc.want)
		}
		if g := floodGoal(res, []string{kindGRPC, kindHTTP}); g.Status != goalMet {
			t.Errorf("%s: the health goal %+v, want met", tc.name, g)
		}
	}
	if g := floodGoal(&Results{}, []string{kindAcquire}); g.Status != goalNotMeasured {
		t.Errorf("without the part: %+v", g)
	}
}
