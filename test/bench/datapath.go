package main

import (
	"context"
	"fmt"
	"strings"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
)

// The restore part's ports+limits variant (-restore-datapath): every
// lease holds a published port and bandwidth limits each way, and its
// counters, which every lease has. Issue 46's goal: a restart with
// 10,000 of them serves within 1.1× the plain variant's time, same N,
// same run.

// goalDatapathRatio is the most SERVING of the ports+limits variant may
// take against the plain one's at the same N.
const goalDatapathRatio = 1.1

// datapathPortBase is the host port of the first lease's published port
// in the ports+limits variant, each lease's one above the one before:
// below the ephemeral range, so the host binds none of them.
const datapathPortBase = 20000

// datapathRate is each lease's limit each way, bits per second.
const datapathRate = 100_000_000

// datapathRequest gives the k-th lease (from 1) a published port and
// limits each way, as a container with one published port and the
// kubelet's bandwidth annotations gets them.
func datapathRequest(k int, req *phasegatev1.AcquireRequest) {
	req.Ports = []*phasegatev1.PublishedPort{{HostPort: uint32(datapathPortBase + k - 1), SlotPort: 8080, Protocol: "tcp"}}
	req.Bandwidth = &phasegatev1.Bandwidth{IngressRate: datapathRate, EgressRate: datapathRate}
}

// listAfterRestart lists the leases after a restart: how many are
// acquired, and in the ports+limits variant how many of them show their
// port and limits.
func listAfterRestart(ctx context.Context, d *daemon, v restoreVariant, run *Run) error {
	slots, err := listOwned(ctx, d.slotsTarget(), leaseOwner)
	if err != nil {
		return err
	}
	run.Listed = countAcquired(slots)
	if v.datapath {
		run.DatapathKept = countDressed(slots)
	}
	return nil
}

// countDressed counts the listed leases that show the published port
// and the limits datapathRequest gave them.
func countDressed(slots []*phasegatev1.Slot) int {
	n := 0
	for _, s := range slots {
		if s.GetState() != phasegatev1.SlotState_SLOT_STATE_ACQUIRED {
			continue
		}
		ps, bw := s.GetPorts(), s.GetBandwidth()
		if len(ps) == 1 && ps[0].GetSlotPort() == 8080 && ps[0].GetHostPort() >= datapathPortBase &&
			bw.GetIngressRate() == datapathRate && bw.GetEgressRate() == datapathRate {
			n++
		}
	}
	return n
}

// datapathRestoreGoal is restoreGoal for the ports+limits variant, with
// its SERVING against the plain variant's at the same N, same run, and
// every lease's port and limits listed after every restart.
func datapathRestoreGoal(r *Results) Goal {
	g := Goal{Name: "leased slots each with a published port and bandwidth limits, across a restart (SIGTERM and kill -9), every N ≤ 10,000: " +
		"SERVING after exec (median) against the plain variant's at the same N, same run; every lease restored, listed with its port and limits",
		Target: fmt.Sprintf("SERVING ≤ %.0f ms and ≤ %.1f× plain, N/N restored and listed with their ports and limits, 0 lost, 0 destroyed, every run", goalRestoreServingMs, goalDatapathRatio)}
	parts, misses, any := restoreFigures(r, datapathStrategies)
	if !any {
		g.Status, g.Note = goalNotMeasured, "part restore not run with -restore-datapath"
		return g
	}
	for _, p := range r.points(datapathStrategies...) {
		if p.N > goalMaxServingN {
			continue
		}
		ratio, ok := r.servingVsPlain(p)
		if !ok {
			misses = append(misses, fmt.Sprintf("%s N=%d: no plain run to compare with", p.Strategy, p.N))
			continue
		}
		parts = append(parts, fmt.Sprintf("%s N=%d: %.2f× plain", p.Strategy, p.N, ratio))
		if ratio > goalDatapathRatio {
			misses = append(misses, fmt.Sprintf("%s N=%d: SERVING %.2f× plain (goal %.1f×)", p.Strategy, p.N, ratio, goalDatapathRatio))
		}
		for _, run := range p.Runs {
			if !run.NoStart && run.DatapathKept < p.N {
				misses = append(misses, fmt.Sprintf("%s N=%d: %d of %d leases listed with their port and limits", p.Strategy, p.N, run.DatapathKept, p.N))
				break
			}
		}
	}
	g.Measured = strings.Join(parts, "; ")
	verdict(&g, any, misses)
	return g
}
