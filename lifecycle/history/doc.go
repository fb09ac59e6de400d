// Package history keeps the starts of a lifecycle before this one, so that
// every view can say whether this one is usual.
//
// An operator who reads "reclaim 4.6s" cannot tell whether that is how
// long reclaim always takes. A [Log] answers: it keeps each start's phases
// and background tasks (how long each took, its attempts, its progress
// total and its outcome) in a bounded ring in one file, and [Log.Usual]
// gives a step's median and spread over the starts kept, which the views
// print beside the current figure ("usually 0.3s (0.2s–0.4s) over the last
// 20 starts, ~10 namespaces"). [Usual.Slow] flags a step much slower than
// usual.
//
// A history must never block or slow a start: [Open] reads a missing,
// damaged or foreign file as an empty history and says why, and [Log.Add]
// writes the ring whole to a new file renamed over the old one, so a crash
// leaves the old ring or the new, never half of one.
package history
