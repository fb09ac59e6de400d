// Package eventstream serves a lifecycle's events over HTTP as a
// Server-Sent Events stream, and follows such a stream from another process.
//
// [NewHandler] serves the [lifecycle.Event] log of one lifecycle: the events
// recorded so far, then each new one as it happens, until the lifecycle's
// final event (it stopped) or until the client leaves. Each event is one SSE
// message,
//
//	id: 12
//	event: phase
//	data: {"seq":12,"time":"…","kind":"phase","name":"reclaim","from":"pending","to":"running","attempt":1,"depends_on":["lock"]}
//
// whose id is the event's sequence number, so a browser's EventSource, curl
// or [Client] resumes exactly where it left off with the Last-Event-ID header
// (or ?after=N). The handler reads the lifecycle's retained log and never
// holds the lifecycle up, however slow the client.
//
// [Client.Follow] reads such a stream, reconnecting and resuming after the
// last event it saw whenever the connection drops, and checks that the
// sequence numbers go up by one: a gap or a repeat is an error, never
// skipped, so a caller that gets nil back saw every event exactly once.
//
// A draining server closes the handler ([Handler.Close]) as it stops
// taking requests: each stream is sent the events recorded so far and a
// "closed" message, and [Client.Follow] returns [ErrClosed]. Without it a
// stream would last until the lifecycle's final event, which comes after
// the port is gone, and the drain would wait for it.
//
// Mount the handler wherever the program serves debug endpoints:
//
//	h := eventstream.NewHandler(lc)
//	mux.Handle("GET /debug/events", h)
//	srv.RegisterOnShutdown(h.Close) // an *http.Server; app.App does this for you
//
// and follow it with
//
//	curl -N http://127.0.0.1:7000/debug/events
package eventstream
