package test

import (
	"testing"
	"time"

	"github.com/phasegate/phasegate/test/internal/portflood"
)

// The floods of the port before it knows a connection's protocol, as
// nobody with no credentials, each for 8 s beside a quiet phase of the
// same daemon (docs/SECURITY.md, "The port before the protocol"): DATA
// frames of 16 MiB after the preface (cmux kept every byte while it looked
// for a HEADERS frame: 240 MiB sent took the daemon from 28 MB to 888 MB),
// the header alone of a 16 MiB frame (http2.Framer allocated the 16 MiB:
// 1 GB for 64 connections), PING frames up to just under the bound on what
// the port reads before the handover, then silence, and SETTINGS frames
// from a client that never reads (cmux answered each with a write without
// a deadline: the connection outlived its sniff timeout by 30 s and more).
// Each time nobody's connections end within the sniff timeout, the
// daemon's memory stays within what its bounds allow, and the victim is
// untouched: every renewal of root's served, health answering, the same
// lease, namespace and link, its workload answering.
func TestPortFloodBeforeTheProtocol(t *testing.T) {
	r := newFloodRig(t)
	quiet := r.quiet(3 * time.Second)
	quiet.served(t, 2)
	const sniffTimeout = 5 * time.Second // the daemon's, server.DefaultConfig
	for _, tc := range []struct {
		mode string
		// longest a connection may live, and what the daemon's resident
		// memory may grow by (MiB): what nobody's share of the connections
		// being sniffed may hold (16 of 80 KiB, about 2 MiB), and the
		// heap the runtime lets grow under the churn of thousands of
		// connections refused, collected as it goes
		longest time.Duration
		grown   int
		want    func(portflood.Report) bool
	}{
		{"h2data", time.Second, 48, func(f portflood.Report) bool { return f.Attempts > 64 }},
		{"h2header", time.Second, 48, func(f portflood.Report) bool { return f.Attempts > 64 }},
		{"stall", sniffTimeout + 2*time.Second, 48, func(f portflood.Report) bool { return f.Attempts >= 64 }},
		{"noread", sniffTimeout + 2*time.Second, 48, func(f portflood.Report) bool { return f.Attempts >= 64 }},
	} {
		before := metricValue(scrapeMetrics(t, r.d), "phasegate_conns_refused_total", "surface", "port", "reason", "protocol")
		rep, w := r.flood(tc.mode, 64, 8*time.Second)
		t.Logf("%s flood as nobody: %d connections, %.1f MiB taken by the kernel, the longest lived %.2fs, %d refused at once",
			tc.mode, rep.Attempts, float64(rep.Sent)/(1<<20), rep.Longest, rep.Refused)
		w.served(t, 6)
		if !tc.want(rep) {
			t.Errorf("%s flood: %+v", tc.mode, rep)
		}
		if longest := time.Duration(rep.Longest * float64(time.Second)); longest > tc.longest {
			t.Errorf("%s flood: a connection lived %v before the daemon ended it, want at most %v", tc.mode, longest.Round(time.Millisecond), tc.longest)
		}
		if grown := (w.maxRSS - quiet.rss) >> 10; grown > tc.grown {
			t.Errorf("%s flood: the daemon's memory grew by %d MiB (VmRSS %d MiB at most, %d MiB when quiet), want at most %d",
				tc.mode, grown, w.maxRSS>>10, quiet.rss>>10, tc.grown)
		}
		after := metricValue(scrapeMetrics(t, r.d), "phasegate_conns_refused_total", "surface", "port", "reason", "protocol")
		if refusesFrames := tc.mode == "h2data" || tc.mode == "h2header"; refusesFrames && after <= before {
			t.Errorf("%s flood: phasegate_conns_refused_total{reason=protocol} went from %v to %v", tc.mode, before, after)
		}
	}
	r.finish()
}
