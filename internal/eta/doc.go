// Package eta is the arithmetic and wording of progress rates and times left that lifecycle and the views printing them share.
//
// lifecycle computes the estimate of a phase or task with it, and
// app, health, timeline and the command line print rates and times left with
// it, so that "812/s, ~5s left" reads the same wherever it is shown. It is
// internal: an adopter reads lifecycle's Estimate and its String.
package eta
