package phases

import (
	"context"
	"io"
	"net/http"
	"time"

	"github.com/phasegate/phasegate/control"
	"github.com/phasegate/phasegate/phases/internal/jsonroute"
	"github.com/phasegate/phasegate/phases/lease"
	"github.com/phasegate/phasegate/phases/slotsapi"
)

// The operator's routes on the control socket for the held slots (`phasegate
// held`): root's alone, whatever the policy grants. Each is audited under
// its method name, as the Slots API's calls are.
const (
	PathHeld        = "/held"
	PathHeldAdopt   = "/held/adopt"
	PathHeldRelease = "/held/release"
)

// heldRoutes is the table of the held slots' routes, declared once: the
// socket declares them, the guard names them, register binds them.
func heldRoutes(d *Daemon) []jsonroute.Route {
	list := func(context.Context, []byte) (any, error) { return d.listHeld() }
	return []jsonroute.Route{
		{Pattern: http.MethodGet + " " + PathHeld, Method: "HeldList", Call: list},
		{Pattern: http.MethodPost + " " + PathHeldAdopt, Method: "HeldAdopt", Mutating: true, Call: decodeHeld(d.adoptHeld)},
		{Pattern: http.MethodPost + " " + PathHeldRelease, Method: "HeldRelease", Mutating: true, Call: decodeHeld(d.releaseHeld)},
	}
}

// decodeHeld adapts fn to a held route's call, a request it cannot decode
// refused as invalid.
func decodeHeld[Req, Ans any](fn func(context.Context, Req) (Ans, error)) func(context.Context, []byte) (any, error) {
	return jsonroute.Decode(fn, func(msg string) error { return lease.Errorf(lease.ErrInvalid, "%s", msg) })
}

// heldMethods returns the guard's method names of the held slots' routes,
// mutating and not.
func heldMethods() (mutating, reads []string) { return jsonroute.Methods(heldRoutes(nil)) }

// bindHeld binds the held slots' routes on the control socket.
func (d *Daemon) bindHeld() error {
	for _, r := range heldRoutes(d) {
		if err := d.ctl.srv.BindHTTP(r.Pattern, heldHandler(d.ctl.guard, r)); err != nil {
			return err
		}
	}
	return nil
}

// HeldError is the answer of a held slots' route that failed: the gRPC
// code's name and the reason.
type HeldError struct {
	Code  string `json:"code"`
	Error string `json:"error"`
}

// heldHandler serves route r behind guard g, to root alone: JSON in and
// out, an error as a HeldError with the HTTP status of its code.
func heldHandler(g *control.Guard, r jsonroute.Route) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		var answer any
		err := g.Call(req.Context(), r.Method, func(ctx context.Context) error {
			var err error
			answer, err = serveHeld(ctx, r, w, req)
			return slotsapi.Status(err) // its code for the guard's audit line
		})
		if err != nil {
			st := slotsapi.Convert(err)
			jsonroute.Write(w, slotsapi.HTTPStatus(st.Code()), HeldError{Code: st.Code().String(), Error: st.Message()})
			return
		}
		jsonroute.Write(w, http.StatusOK, answer)
	})
}

// serveHeld answers req on route r, for root alone.
func serveHeld(ctx context.Context, r jsonroute.Route, w http.ResponseWriter, req *http.Request) (any, error) {
	c, err := slotsapi.CallerOf(ctx)
	if err != nil {
		return nil, err
	}
	if !c.Principal.IsRoot() {
		return nil, lease.Errorf(lease.ErrDenied, "%s may not act on held slots: root's alone", c.Principal)
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, req.Body, 64<<10))
	if err != nil {
		return nil, lease.Errorf(lease.ErrInvalid, "read the request: %v", err)
	}
	return r.Call(ctx, body)
}

// HeldList is GET /held's answer.
type HeldList struct {
	Held []HeldView `json:"held"`
}

// HeldView is one held slot as the operator sees it (GET /held).
type HeldView = lease.HeldView

// listHeld describes every held slot.
func (d *Daemon) listHeld() (HeldList, error) {
	held, err := d.slots.HeldViews()
	return HeldList{Held: held}, err
}

// AdoptRequest is POST /held/adopt's request: the lease the held slot at
// Index becomes, for Owner (with RequestID and TTL, as an Acquire's).
type AdoptRequest struct {
	Index     int    `json:"index"`
	Owner     string `json:"owner"`
	RequestID string `json:"request_id,omitempty"`
	// TTL is a Go duration ("30m"); empty: held until released.
	TTL string `json:"ttl,omitempty"`
}

// AdoptAnswer is the lease a held slot became.
type AdoptAnswer struct {
	Index     int    `json:"index"`
	Owner     string `json:"owner"`
	RequestID string `json:"request_id,omitempty"`
	LeaseID   string `json:"lease_id"`
	Principal string `json:"principal"`
	TTL       string `json:"ttl,omitempty"`
	// Repaired says what of the slot's host side was put back.
	Repaired []string `json:"repaired,omitempty"`
}

// adoptHeld makes the held slot at req.Index a lease again, for its
// owner, as it is (lease.Service.AdoptHeld), with the root principal that
// adopted it.
func (d *Daemon) adoptHeld(ctx context.Context, req AdoptRequest) (AdoptAnswer, error) {
	var ttl time.Duration
	if req.TTL != "" {
		var err error
		if ttl, err = time.ParseDuration(req.TTL); err != nil || ttl <= 0 {
			return AdoptAnswer{}, lease.Errorf(lease.ErrInvalid, "ttl %q: a positive duration, or none for a lease held until released", req.TTL)
		}
	}
	c, err := slotsapi.CallerOf(ctx)
	if err != nil {
		return AdoptAnswer{}, err
	}
	l, err := d.slots.AdoptHeld(ctx, c, req.Index, lease.Request{Owner: req.Owner, RequestID: req.RequestID, TTL: ttl})
	if err != nil {
		return AdoptAnswer{}, err
	}
	a := AdoptAnswer{Index: l.Rec.Index, Owner: l.Rec.Owner, RequestID: l.Rec.RequestID, LeaseID: l.Rec.LeaseID, Principal: l.Rec.Principal, Repaired: l.Repaired}
	if ttl > 0 {
		a.TTL = ttl.String()
	}
	return a, nil
}

// ReleaseRequest is POST /held/release's request.
type ReleaseRequest struct {
	Index int `json:"index"`
}

// ReleaseAnswer says what the release of a held slot did to the
// processes that lived in it: cut off with their namespace, or killed
// with --reclaim-kill-orphans.
type ReleaseAnswer struct {
	Index   int            `json:"index"`
	Orphans []ReleasedProc `json:"processes,omitempty"`
}

// ReleasedProc is a process that lived in a released slot.
type ReleasedProc struct {
	PID    int    `json:"pid"`
	Comm   string `json:"comm"`
	Killed bool   `json:"killed"`
}

// releaseHeld tears the held slot at req.Index down
// (lease.Service.ReleaseHeld): the processes inside are cut off with their
// namespace, or killed when the daemon runs with --reclaim-kill-orphans.
func (d *Daemon) releaseHeld(ctx context.Context, req ReleaseRequest) (ReleaseAnswer, error) {
	res, err := d.slots.ReleaseHeld(ctx, req.Index)
	if err != nil {
		return ReleaseAnswer{}, err
	}
	a := ReleaseAnswer{Index: req.Index}
	for _, o := range res.Orphans {
		a.Orphans = append(a.Orphans, ReleasedProc{PID: o.PID, Comm: o.Comm, Killed: o.Killed})
	}
	return a, nil
}
