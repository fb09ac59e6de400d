package test

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
)

// bandwidthShown is what the slots commands print of a lease's limits.
type bandwidthShown struct {
	Slot struct {
		Index     int `json:"index"`
		Bandwidth *struct {
			IngressRate  string `json:"ingress_rate"`
			IngressBurst string `json:"ingress_burst"`
			EgressRate   string `json:"egress_rate"`
		} `json:"bandwidth"`
	} `json:"slot"`
	LeaseID string `json:"lease_id"`
}

// checkBandwidthCommands checks a lease's bandwidth limits from the
// command line, as the README shows them: acquire with limits, the
// default burst shown by get, limits no one means refused and nothing
// changed, limits replaced, then cleared.
func checkBandwidthCommands(t *testing.T, d *daemon) {
	t.Helper()
	sock := "--socket=" + d.control
	out, code := cli(t, "slots", "acquire", "vm-42", "--request-id=bw-1", "--ingress-rate", "40000000", "--egress-rate", "20000000", sock)
	var acq bandwidthShown
	if code != 0 || json.Unmarshal([]byte(out), &acq) != nil || acq.Slot.Bandwidth == nil || acq.Slot.Bandwidth.IngressRate != "40000000" {
		t.Fatalf("slots acquire with limits: exit %d\n%s", code, out)
	}
	idx := strconv.Itoa(acq.Slot.Index)
	get := func() bandwidthShown {
		out, code := cli(t, "slots", "get", idx, sock)
		var g bandwidthShown
		if code != 0 || json.Unmarshal([]byte(out), &g) != nil {
			t.Fatalf("slots get: exit %d\n%s", code, out)
		}
		return g
	}
	if g := get(); g.Slot.Bandwidth == nil || g.Slot.Bandwidth.IngressBurst != "800000" {
		t.Errorf("slots get: %+v, want the default burst 800000", g.Slot.Bandwidth)
	}
	if out, code := cli(t, "slots", "bandwidth", idx, acq.LeaseID, "--egress-rate", "100", sock); code != 1 || !strings.Contains(out, "InvalidArgument") {
		t.Errorf("slots bandwidth at 100 bit/s: exit %d\n%s", code, out)
	}
	if out, code := cli(t, "slots", "bandwidth", idx, acq.LeaseID, "--egress-rate", "-5", sock); code != 2 {
		t.Errorf("slots bandwidth at -5: exit %d\n%s", code, out)
	}
	if g := get(); g.Slot.Bandwidth == nil || g.Slot.Bandwidth.IngressRate != "40000000" || g.Slot.Bandwidth.EgressRate != "20000000" {
		t.Errorf("after the refusals: %+v", g.Slot.Bandwidth)
	}
	if out, code := cli(t, "slots", "bandwidth", idx, acq.LeaseID, "--egress-rate", "8000000", sock); code != 0 {
		t.Errorf("slots bandwidth: exit %d\n%s", code, out)
	}
	if g := get(); g.Slot.Bandwidth == nil || g.Slot.Bandwidth.IngressRate != "" || g.Slot.Bandwidth.EgressRate != "8000000" {
		t.Errorf("after slots bandwidth --egress-rate 8000000: %+v", g.Slot.Bandwidth)
	}
	if out, code := cli(t, "slots", "bandwidth", idx, acq.LeaseID, sock); code != 0 {
		t.Errorf("slots bandwidth (clear): exit %d\n%s", code, out)
	}
	if g := get(); g.Slot.Bandwidth != nil {
		t.Errorf("after the limits were cleared: %+v", g.Slot.Bandwidth)
	}
	if out, code := cli(t, "slots", "release", idx, acq.LeaseID, sock); code != 0 {
		t.Errorf("slots release: exit %d\n%s", code, out)
	}
}
