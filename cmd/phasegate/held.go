package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"syscall"
	"time"

	"github.com/phasegate/phasegate/internal/names"
	"github.com/phasegate/phasegate/phases"
)

const heldUsage = `held [list|adopt|release] [flags] [args]

  list                                        the slots held: something lives in them and no
                                              record vouches for them (the records were lost)
  adopt INDEX --owner OWNER [--request-id ID] [--ttl D]
                                              make the held slot a lease of OWNER again, as it
                                              is; prints the lease with its lease id
  release INDEX                               tear the held slot down: what lives in it is cut
                                              off, or killed if the daemon runs with
                                              --reclaim-kill-orphans

Held slots are the daemon's answer to records it cannot vouch with (a
state file or journal lost next to slots in use): it keeps and quarantines
every slot something lives in rather than reclaim it. This command asks the
running daemon on its control socket (--socket, or the one in --state-dir),
as root.`

// heldVerbs are the command's verbs and their number of arguments.
func heldVerbs() verbs {
	return verbs{command: "held", usage: heldUsage, args: map[string]int{"list": 0, "adopt": 1, "release": 1}}
}

// heldCmd lists, adopts and releases the held slots of a running daemon,
// on its control socket.
func heldCmd(ctx context.Context, e env) int {
	fs := flag.NewFlagSet("held", flag.ContinueOnError)
	var socket, stateDir string
	registerSocket(fs, &socket, &stateDir)
	owner := fs.String("owner", "", "adopt: the owner the lease is for")
	requestID := fs.String("request-id", "", "adopt: the owner's request id for the lease (a retried Acquire of it finds the lease)")
	var ttl ttlValue
	fs.Var(&ttl, "ttl", "adopt: the lease's TTL (none: held until released)")
	timeout := fs.Duration("timeout", time.Minute, "how long to wait for the daemon")
	args := e.args
	if len(args) == 0 || (args[0] != "" && args[0][0] == '-' && !isHelp(args[0])) {
		args = append([]string{"list"}, args...)
	}
	verb, pos, code, done := heldVerbs().parseOrExit(fs, e, args)
	if done {
		return code
	}
	c := heldClient{socket: controlSocket(socket, stateDir)}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	var answer any
	var err error
	switch verb {
	case "list":
		var l phases.HeldList
		answer = &l
		err = c.call(ctx, http.MethodGet, phases.PathHeld, nil, &l)
	case "adopt":
		i, perr := strconv.Atoi(pos[0])
		if perr != nil || *owner == "" {
			fmt.Fprintf(e.stderr, "usage: phasegate held adopt INDEX --owner OWNER [--request-id ID] [--ttl D]\n")
			return exitUsage
		}
		var a phases.AdoptAnswer
		req := phases.AdoptRequest{Index: i, Owner: *owner, RequestID: *requestID}
		if ttl.set {
			req.TTL = ttl.d.String()
		}
		answer = &a
		err = c.call(ctx, http.MethodPost, phases.PathHeldAdopt, req, &a)
	case "release":
		i, perr := strconv.Atoi(pos[0])
		if perr != nil {
			fmt.Fprintf(e.stderr, "usage: phasegate held release INDEX\n")
			return exitUsage
		}
		var a phases.ReleaseAnswer
		answer = &a
		err = c.call(ctx, http.MethodPost, phases.PathHeldRelease, phases.ReleaseRequest{Index: i}, &a)
	}
	if err != nil {
		fmt.Fprintf(e.stderr, "phasegate held %s: %v\n", verb, err)
		return exitFailed
	}
	b, err := json.MarshalIndent(answer, "", "  ")
	if err != nil {
		fmt.Fprintf(e.stderr, "phasegate held: %v\n", err)
		return exitFailed
	}
	// ASCII: a name recorded before the names rule reads escaped.
	fmt.Fprintln(e.stdout, string(names.ASCIIJSON(b)))
	return exitOK
}

// heldClient calls the held slots' routes on the control socket.
type heldClient struct{ socket string }

// call sends req (nil: no body) as JSON and decodes the answer into out,
// or returns the daemon's error.
func (c heldClient) call(ctx context.Context, method, path string, req, out any) error {
	var body io.Reader
	if req != nil {
		b, err := json.Marshal(req)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	hreq, err := http.NewRequestWithContext(ctx, method, "http://phasegate"+path, body)
	if err != nil {
		return err
	}
	hc := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", c.socket)
		},
	}}
	defer hc.CloseIdleConnections()
	resp, err := hc.Do(hreq)
	if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("control socket %s: %w (%s)", c.socket, err, noDaemonHint(c.socket))
	}
	if err != nil {
		return fmt.Errorf("control socket %s: %w", c.socket, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("control socket %s: %w", c.socket, err)
	}
	if resp.StatusCode != http.StatusOK {
		var he phases.HeldError
		if json.Unmarshal(raw, &he) == nil && he.Error != "" {
			return fmt.Errorf("%s: %s", he.Code, he.Error)
		}
		return fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(raw))
	}
	return json.Unmarshal(raw, out)
}
