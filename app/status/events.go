package status

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/phasegate/phasegate/eventstream"
	"github.com/phasegate/phasegate/lifecycle"
)

// errStartOver ends PrintEvents' follow once the start is over.
var errStartOver = errors.New("the start is over")

// PrintEvents prints the events of the App whose stream is at url (its
// /debug/events), one a line, from the first: until the lifecycle's final
// event, until the serving process closes the stream as it stops, or,
// with untilOver, until the start is over. It returns the exit code:
// ExitServing once the lifecycle serves (with untilOver) or the stream
// ended whole, ExitNotServing when the start failed or the process
// stopped, ExitUnreachable, with the error, when the stream could not be
// read.
func PrintEvents(ctx context.Context, c *http.Client, url string, w io.Writer, untilOver bool) (int, error) {
	code := ExitServing
	err := (&eventstream.Client{HTTPClient: c}).Follow(ctx, url, 0, func(e lifecycle.Event) error {
		fmt.Fprintln(w, e.String())
		if e.Kind != lifecycle.EventLifecycle {
			return nil
		}
		switch e.To {
		case lifecycle.StateServing:
			code = ExitServing
			if untilOver {
				return errStartOver
			}
		case lifecycle.StateFailed, lifecycle.StateDraining, lifecycle.StateStopped:
			code = ExitNotServing
			if untilOver {
				return errStartOver
			}
		}
		return nil
	})
	switch {
	case err == nil, errors.Is(err, errStartOver):
		return code, nil
	case errors.Is(err, eventstream.ErrClosed):
		return ExitNotServing, nil
	}
	return ExitUnreachable, err
}
