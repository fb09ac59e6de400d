// Package eventlog is how readers follow an append-only log: their
// wake-up, the batch each is due and the loop that follows.
//
// It is what such a log needs besides its events: the wake-up of the
// readers waiting for the next change, the batch a reader is due from its
// position, and the loop that follows the log with both.
//
// A lifecycle.Lifecycle keeps its own event log with it, and
// phasetest.Recorder the log it is handed; each holds its own lock around
// its [Wake] and [Since], so that what is appended and who is woken change
// together.
package eventlog
