package app

import "github.com/phasegate/phasegate/app/status"

// View is the JSON form of a lifecycle snapshot served at [PathLifecycle]
// (package app/status, which reads it too).
type View = status.View

// PhaseView is one phase or background task in a [View].
type PhaseView = status.PhaseView
