package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
	"github.com/phasegate/phasegate/phases"
)

const slotsUsage = `slots <acquire|release|keepalive|get|list> [flags] [args]

  acquire OWNER [--request-id ID] [--ttl D]   lease a slot; prints it with its lease id
  release INDEX LEASE_ID                      end a lease
  keepalive INDEX LEASE_ID                    renew a lease with a TTL
  get INDEX                                   one slot
  list [--all]                                the slots that are not free (--all: every one)

The Slots API is on the daemon's control socket (--socket; root, or a
member of its --control-group, as the daemon's policy allows), or on its
TCP port with mutual TLS (--addr with --tls-ca, --tls-cert, --tls-key).`

// slotsCmd is a client of the Slots API on a running daemon, printing its
// answers as JSON: what an operator or a script needs without grpcurl.
func slotsCmd(ctx context.Context, e env) int {
	fs := flag.NewFlagSet("slots", flag.ContinueOnError)
	socket := fs.String("socket", phases.DefaultConfig().ControlSocket(), "the daemon's control socket")
	addr := fs.String("addr", "", "the daemon's TCP address instead of its socket: needs mutual TLS (--tls-ca, --tls-cert, --tls-key)")
	timeout := fs.Duration("timeout", 30*time.Second, "how long to wait for an answer")
	requestID := fs.String("request-id", "", "acquire: the request's id, so that a retry gets the same slot")
	ttl := fs.Duration("ttl", 0, "acquire: the lease's time to live, renewed with keepalive (0: held until released)")
	all := fs.Bool("all", false, "list: free slots too")
	var tf clientTLSFlags
	tf.register(fs)
	if len(e.args) == 0 {
		fmt.Fprintf(e.stderr, "usage: phasegate %s\n", slotsUsage)
		return exitUsage
	}
	if isHelp(e.args[0]) {
		usage(e.stdout, fs, slotsUsage)
		return exitOK
	}
	verb, rest := e.args[0], e.args[1:]
	// Flags may come before or after the positional arguments.
	var pos []string
	for len(rest) > 0 {
		if err := parseFlagsKeepArgs(fs, rest, e.lookupEnv); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				usage(e.stdout, fs, slotsUsage)
				return exitOK
			}
			fmt.Fprintf(e.stderr, "phasegate slots: %s\n", oneLine(err))
			return exitUsage
		}
		rest = fs.Args()
		if len(rest) > 0 {
			pos, rest = append(pos, rest[0]), rest[1:]
		}
	}
	want := map[string]int{"acquire": 1, "release": 2, "keepalive": 2, "get": 1, "list": 0}
	n, ok := want[verb]
	if !ok || len(pos) != n {
		fmt.Fprintf(e.stderr, "usage: phasegate %s\n", slotsUsage)
		return exitUsage
	}
	index := func(s string) (uint32, error) {
		i, err := strconv.ParseUint(s, 10, 32)
		if err != nil {
			return 0, fmt.Errorf("index %q is not a number", s)
		}
		return uint32(i), nil
	}
	tc, err := tf.config()
	if err != nil {
		fmt.Fprintf(e.stderr, "phasegate slots: %v\n", err)
		return exitUsage
	}
	target := "unix://" + *socket
	creds := insecure.NewCredentials()
	if *addr != "" {
		target = *addr
		if tc != nil {
			creds = credentials.NewTLS(tc)
		}
	} else if tc != nil {
		fmt.Fprintf(e.stderr, "phasegate slots: --tls-ca and --tls-cert are for --addr: the control socket needs none\n")
		return exitUsage
	}
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(creds))
	if err != nil {
		fmt.Fprintf(e.stderr, "phasegate slots: %v\n", err)
		return exitUsage
	}
	defer conn.Close()
	c := phasegatev1.NewSlotsClient(conn)
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()

	var resp proto.Message
	switch verb {
	case "acquire":
		req := &phasegatev1.AcquireRequest{Owner: pos[0], RequestId: *requestID}
		if *ttl > 0 {
			req.Ttl = durationpb.New(*ttl)
		}
		resp, err = c.Acquire(ctx, req)
	case "release", "keepalive":
		var i uint32
		if i, err = index(pos[0]); err != nil {
			break
		}
		if verb == "release" {
			resp, err = c.Release(ctx, &phasegatev1.ReleaseRequest{Index: i, LeaseId: pos[1]})
		} else {
			resp, err = c.KeepAlive(ctx, &phasegatev1.KeepAliveRequest{Index: i, LeaseId: pos[1]})
		}
	case "get":
		var i uint32
		if i, err = index(pos[0]); err != nil {
			break
		}
		resp, err = c.Get(ctx, &phasegatev1.GetRequest{Index: i})
	case "list":
		resp, err = c.List(ctx, &phasegatev1.ListRequest{IncludeFree: *all})
	}
	if err != nil {
		if st, ok := status.FromError(err); ok {
			fmt.Fprintf(e.stderr, "phasegate slots %s: %s: %s\n", verb, st.Code(), st.Message())
		} else {
			fmt.Fprintf(e.stderr, "phasegate slots %s: %v\n", verb, err)
		}
		return exitFailed
	}
	b, err := protojson.MarshalOptions{Multiline: true, UseProtoNames: true}.Marshal(resp)
	if err != nil {
		fmt.Fprintf(e.stderr, "phasegate slots: %v\n", err)
		return exitFailed
	}
	fmt.Fprintln(e.stdout, string(b))
	return exitOK
}
