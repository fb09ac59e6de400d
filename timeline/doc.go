// Package timeline draws a lifecycle's start as a timeline.
//
// It draws an HTML page with a server-rendered SVG chart, one bar per phase
// and per background task on a shared time axis, coloured by state, labelled
// with durations, progress, rates and times left, and joined by the
// dependency edges. A table below repeats the figures as text.
//
// The page needs no JavaScript: while the lifecycle starts it reloads
// itself (a meta refresh), so an operator can leave it open on a slow
// node and watch the start go by. [Handler] serves it from a live
// lifecycle; [Render] writes it for one snapshot.
package timeline
