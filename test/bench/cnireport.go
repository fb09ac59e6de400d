package main

import (
	"bytes"
	"fmt"
	"io"
	"strings"
)

// Goals of the CNI part (issue 35).
const (
	goalCNIP99VsReference    = 0.25 // phasegate's ADD and DEL p99 / the reference's
	goalCNIPodmanVsReference = 1.0  // podman run to a network-ready container / the reference's
	goalCNIGCVsFloor         = 2.0  // one GC of the forgotten attachments / the kernel floor
)

// side returns the part's figures of plugin from callers.
func (c *CNIResult) side(plugin string, callers int) (CNISide, bool) {
	for _, s := range c.Sides {
		if s.Plugin == plugin && s.Callers == callers {
			return s, true
		}
	}
	return CNISide{}, false
}

// cniGoals are the CNI part's three goals.
func cniGoals(r *Results) []Goal {
	calls := Goal{Name: "CNI ADD and DEL p99 vs the reference bridge + host-local, 1 and 16 callers",
		Target: fmt.Sprintf("≤ %.2f× each", goalCNIP99VsReference)}
	podman := Goal{Name: "`podman run` to a network-ready container vs the reference network",
		Target: fmt.Sprintf("≤ %.1f× (p50)", goalCNIPodmanVsReference)}
	gc := Goal{Name: "one CNI GC of the attachments a runtime forgot vs the kernel floor of their removal",
		Target: fmt.Sprintf("≤ %.0f×", goalCNIGCVsFloor)}
	c := r.CNI
	if c == nil {
		for _, g := range []*Goal{&calls, &podman, &gc} {
			g.Status, g.Note = goalNotMeasured, fmt.Sprintf(noteNotMeasuredInPart, partCNI)
		}
		return []Goal{calls, podman, gc}
	}
	var parts, misses []string
	for _, callers := range cniCallers {
		pg, ok1 := c.side(pluginPhasegate, callers)
		ref, ok2 := c.side(pluginReference, callers)
		if !ok1 || !ok2 {
			continue
		}
		for _, v := range []struct {
			verb    string
			pg, ref LatencyStats
		}{{"ADD", pg.Add, ref.Add}, {"DEL", pg.Del, ref.Del}} {
			ratio := v.pg.P99Ms / v.ref.P99Ms
			parts = append(parts, fmt.Sprintf("%s %d callers %.2f× (%s vs %s)", v.verb, callers, ratio, fmtMs(v.pg.P99Ms), fmtMs(v.ref.P99Ms)))
			if ratio > goalCNIP99VsReference {
				misses = append(misses, fmt.Sprintf("%s with %d callers over by %.2f×", v.verb, callers, ratio-goalCNIP99VsReference))
			}
			if v.pg.Errors > 0 {
				misses = append(misses, fmt.Sprintf("%d errors of %s with %d callers: %s", v.pg.Errors, v.verb, callers, v.pg.FirstError))
			}
		}
	}
	if execs := c.ExecAllMs[pluginPhasegate]; len(execs) > 0 {
		// The floor of any call: the plugin's exec, doing nothing.
		parts = append(parts, fmt.Sprintf("the plugin's exec alone (VERSION) p99 %s", fmtMs(percentileOf(execs, 0.99))))
	}
	calls.Measured = strings.Join(parts, "; ")
	verdict(&calls, len(parts) > 0, misses)

	pgRun, refRun := percentileOf(c.Podman[pluginPhasegate], 0.5), percentileOf(c.Podman[pluginReference], 0.5)
	if len(c.Podman[pluginPhasegate]) > 0 && len(c.Podman[pluginReference]) > 0 {
		ratio := pgRun / refRun
		podman.Measured = fmt.Sprintf("%.2f× (%s vs %s, %d runs each)", ratio, fmtMs(pgRun), fmtMs(refRun), len(c.Podman[pluginPhasegate]))
		podman.Status, podman.Note = bound(ratio, goalCNIPodmanVsReference, "×")
	} else {
		podman.Status, podman.Note = goalNotMeasured, "-cni-podman 0"
	}

	g, f := summarize(c.GCMs), summarize(c.FloorMs)
	if g.Count > 0 && f.Count > 0 {
		ratio := g.Median / f.Median
		gc.Measured = fmt.Sprintf("%.2f× (%s vs %s for %d attachments, medians of %d reps)", ratio, fmtMs(g.Median), fmtMs(f.Median), c.GCN, g.Count)
		gc.Status, gc.Note = bound(ratio, goalCNIGCVsFloor, "×")
	} else {
		gc.Status = goalNotMeasured
	}
	return []Goal{calls, podman, gc}
}

// printCNI writes the part's figures to the table on stdout.
func printCNI(w io.Writer, c *CNIResult) {
	fmt.Fprintf(w, "\nCNI, %d ADDs then DELs per run, %d reps:\n", c.Calls, c.Reps)
	for _, s := range c.Sides {
		fmt.Fprintf(w, "  %-9s %2d callers  ADD p50 %s p99 %s, DEL p50 %s p99 %s, %d errors\n", s.Plugin, s.Callers,
			fmtMs(s.Add.P50Ms), fmtMs(s.Add.P99Ms), fmtMs(s.Del.P50Ms), fmtMs(s.Del.P99Ms), s.Add.Errors+s.Del.Errors)
	}
	for _, p := range []string{pluginPhasegate, pluginReference} {
		fmt.Fprintf(w, "  %-9s exec (VERSION) p50 %s p99 %s; podman run p50 %s\n", p, fmtMs(summarize(c.ExecMs[p]).Median),
			fmtMs(percentileOf(c.ExecAllMs[p], 0.99)), fmtMs(percentileOf(c.Podman[p], 0.5)))
	}
	fmt.Fprintf(w, "  GC of %d forgotten attachments %s, kernel floor %s\n", c.GCN, fmtMs(summarize(c.GCMs).Median), fmtMs(summarize(c.FloorMs).Median))
}

// markdownCNI writes the part's section of report.md.
func markdownCNI(b *bytes.Buffer, c *CNIResult) {
	b.WriteString("### CNI: phasegate's plugin vs the reference bridge + host-local\n\n")
	fmt.Fprintf(b, "Both plugins exec'd as a runtime execs them (`CNI_COMMAND`, the configuration on stdin), into namespaces "+
		"made beforehand: %d ADDs, then their DELs, from 1 and from 16 concurrent callers, each rep; phasegate's daemon with "+
		"a warm pool that holds every ADD (`--pool-size %d`). The reference is Debian's `bridge` with `host-local` on a /20. "+
		"%d reps, the order of the plugins turning.\n\n", c.Calls, c.Calls, c.Reps)
	b.WriteString("| plugin | callers | ADD p50 | ADD p99 | DEL p50 | DEL p99 | errors |\n|---|---:|---:|---:|---:|---:|---:|\n")
	for _, s := range c.Sides {
		fmt.Fprintf(b, "| %s | %d | %s | %s | %s | %s | %d |\n", s.Plugin, s.Callers, fmtMs(s.Add.P50Ms), fmtMs(s.Add.P99Ms),
			fmtMs(s.Del.P50Ms), fmtMs(s.Del.P99Ms), s.Add.Errors+s.Del.Errors)
	}
	b.WriteString("\n| plugin | exec of VERSION, p50 (median over reps) | exec of VERSION, p99 (every exec) | `podman run` to a network-ready container, p50 | runs |\n|---|---:|---:|---:|---:|\n")
	for _, p := range []string{pluginPhasegate, pluginReference} {
		fmt.Fprintf(b, "| %s | %s | %s | %s | %d |\n", p, fmtMs(summarize(c.ExecMs[p]).Median), fmtMs(percentileOf(c.ExecAllMs[p], 0.99)),
			fmtMs(percentileOf(c.Podman[p], 0.5)), len(c.Podman[p]))
	}
	g, f := summarize(c.GCMs), summarize(c.FloorMs)
	fmt.Fprintf(b, "\nGC: %d attachments whose runtime forgot them (their containers still running), ended by one `GC` with no "+
		"valid attachment: %s (median of %d; min %s, max %s). Kernel floor of the same removal (the host ends deleted by index "+
		"from the reclaim's workers, the slots' namespace files unlinked, until every host end is gone): %s.\n\n",
		c.GCN, fmtMs(g.Median), g.Count, fmtMs(g.Min), fmtMs(g.Max), fmtMs(f.Median))
}
