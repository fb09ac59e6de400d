package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
	"github.com/phasegate/phasegate/internal/names"
	"github.com/phasegate/phasegate/phases"
)

const slotsUsage = `slots <acquire|release|keepalive|egress|ports|bandwidth|get|list> [flags] [args]

  acquire OWNER [--request-id ID] [--ttl D] [egress flags] [--publish P]... [bandwidth flags]
                                              lease a slot; prints it with its lease id
  release INDEX LEASE_ID                      end a lease
  keepalive INDEX LEASE_ID                    renew a lease with a TTL
  egress INDEX LEASE_ID [egress flags]        replace the lease's egress policy (none: cleared)
  ports INDEX LEASE_ID [--publish P]...       replace the lease's published ports (none: withdrawn)
  bandwidth INDEX LEASE_ID [bandwidth flags]  replace the lease's bandwidth limits (none: cleared)
  get INDEX                                   one slot
  list [--all]                                the slots that are not free (--all: every one)

The Slots API is on the daemon's control socket (--socket, or the one in
--state-dir; root, or a member of its --control-group, as the daemon's
policy allows), or on its
TCP port with mutual TLS (--addr with --tls-ca, --tls-cert, --tls-key).`

// slotsFlags are the slots client's flags, shared by its verbs.
type slotsFlags struct {
	socket, stateDir string
	addr, requestID  string
	timeout          time.Duration
	ttl              ttlValue
	all              bool
	tls              clientTLSFlags
	egress           egressFlags
	publish          publishFlags
	bandwidth        bandwidthFlags
}

// bandwidthFlags are bandwidth limits on the command line: rates in bits
// per second, bursts in bits (0: the default), as the Slots API takes
// them.
type bandwidthFlags struct {
	inRate, inBurst, outRate, outBurst uint64
}

// limits is the flags' limits; nil when none was given.
func (f bandwidthFlags) limits() *phasegatev1.Bandwidth {
	if f == (bandwidthFlags{}) {
		return nil
	}
	return &phasegatev1.Bandwidth{IngressRate: f.inRate, IngressBurst: f.inBurst, EgressRate: f.outRate, EgressBurst: f.outBurst}
}

// ttlValue is --ttl: a positive duration when set. A zero or negative one
// is refused as the flag is parsed, never sent as "no TTL".
type ttlValue struct {
	d   time.Duration
	set bool
}

func (v *ttlValue) String() string {
	if v == nil || !v.set {
		return ""
	}
	return v.d.String()
}

func (v *ttlValue) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	if d <= 0 {
		return errors.New("must be positive (leave --ttl out for a lease held until released)")
	}
	v.d, v.set = d, true
	return nil
}

// egressFlags are an egress policy on the command line.
type egressFlags struct {
	allow, deny          string
	denyAll, redirectTCP bool
}

// policy is the flags' policy; nil when none was given.
func (f egressFlags) policy() *phasegatev1.EgressPolicy {
	if f.allow == "" && f.deny == "" && !f.denyAll && !f.redirectTCP {
		return nil
	}
	split := func(s string) []string {
		var out []string
		for _, x := range strings.Split(s, ",") {
			if x = strings.TrimSpace(x); x != "" {
				out = append(out, x)
			}
		}
		return out
	}
	return &phasegatev1.EgressPolicy{Allow: split(f.allow), Deny: split(f.deny), DenyAll: f.denyAll, RedirectTcp: f.redirectTCP}
}

func (f *slotsFlags) register(fs *flag.FlagSet) {
	registerSocket(fs, &f.socket, &f.stateDir)
	fs.StringVar(&f.addr, "addr", "", "the daemon's TCP address instead of its socket: needs mutual TLS (--tls-ca, --tls-cert, --tls-key)")
	fs.DurationVar(&f.timeout, "timeout", 30*time.Second, "how long to wait for an answer")
	fs.StringVar(&f.requestID, "request-id", "", "acquire: the request's id, so that a retry gets the same slot")
	fs.Var(&f.ttl, "ttl", "acquire: the lease's time to live, renewed with keepalive, positive (without it: held until released)")
	fs.BoolVar(&f.all, "all", false, "list: free slots too")
	fs.StringVar(&f.egress.allow, "egress-allow", "", "acquire, egress: IPv4 CIDRs the slot may reach, comma-separated")
	fs.StringVar(&f.egress.deny, "egress-deny", "", "acquire, egress: IPv4 CIDRs the slot may not reach, comma-separated")
	fs.BoolVar(&f.egress.denyAll, "egress-deny-all", false, "acquire, egress: drop everything but established traffic and the daemon's always-allowed set")
	fs.BoolVar(&f.egress.redirectTCP, "egress-redirect-tcp", false, "acquire, egress: send new TCP connections to the daemon's egress proxy")
	fs.Var(&f.publish, "publish", "acquire, ports: a published port, [HOSTIP:]HOSTPORT:SLOTPORT[/tcp|udp|sctp] (podman's -p); repeat for more")
	fs.Uint64Var(&f.bandwidth.inRate, "ingress-rate", 0, "acquire, bandwidth: the limit into the slot, bits per second (0: none)")
	fs.Uint64Var(&f.bandwidth.inBurst, "ingress-burst", 0, "acquire, bandwidth: the burst into the slot, bits (0: 20 ms at the rate, at least 64 KiB)")
	fs.Uint64Var(&f.bandwidth.outRate, "egress-rate", 0, "acquire, bandwidth: the limit out of the slot, bits per second (0: none)")
	fs.Uint64Var(&f.bandwidth.outBurst, "egress-burst", 0, "acquire, bandwidth: the burst out of the slot, bits (0: 20 ms at the rate, at least 64 KiB)")
	f.tls.register(fs)
}

// newSlotsFlagSet returns the client's flag set and the flags it sets.
func newSlotsFlagSet() (*flag.FlagSet, *slotsFlags) {
	fs := flag.NewFlagSet("slots", flag.ContinueOnError)
	f := &slotsFlags{}
	f.register(fs)
	return fs, f
}

// slotsVerbs are the client's verbs and how many arguments each takes.
func slotsVerbs() verbs {
	return verbs{command: "slots", usage: slotsUsage, args: map[string]int{"acquire": 1, "release": 2, "keepalive": 2, "egress": 2, "ports": 2, "bandwidth": 2, "get": 1, "list": 0}}
}

// errShownHelp says the help was printed: exit 0.
var errShownHelp = errors.New("help shown")

// slotsCmd is a client of the Slots API on a running daemon, printing its
// answers as JSON: what an operator or a script needs without grpcurl.
func slotsCmd(ctx context.Context, e env) int {
	fs, f := newSlotsFlagSet()
	verb, pos, code, done := slotsVerbs().parseOrExit(fs, e, e.args)
	if done {
		return code
	}
	conn, err := f.dial()
	if err != nil {
		fmt.Fprintf(e.stderr, "phasegate slots: %v\n", err)
		return exitUsage
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	resp, err := f.call(ctx, phasegatev1.NewSlotsClient(conn), verb, pos)
	if err != nil {
		if st, ok := status.FromError(err); ok {
			hint := ""
			switch {
			case f.addr != "" || st.Code() != codes.Unavailable:
			case strings.Contains(st.Message(), "permission denied"):
				hint = " (the control socket admits root and the members of the daemon's --control-group)"
			default:
				hint = " (" + noDaemonHint(controlSocket(f.socket, f.stateDir)) + ")"
			}
			fmt.Fprintf(e.stderr, "phasegate slots %s: %s: %s%s\n", verb, st.Code(), st.Message(), hint)
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
	// ASCII: a name recorded before the names rule reads escaped
	// ("rt-victim\u3164"), never as the name it looks like.
	fmt.Fprintln(e.stdout, string(names.ASCIIJSON(b)))
	return exitOK
}

// registerSocket registers --socket and --state-dir, which say where a
// client finds the daemon's control socket (controlSocket).
func registerSocket(fs *flag.FlagSet, socket, stateDir *string) {
	fs.StringVar(socket, "socket", "", "the daemon's control socket (default <state-dir>/"+phases.ControlSocketName+")")
	fs.StringVar(stateDir, "state-dir", phases.DefaultConfig().StateDir, "the daemon's --state-dir, where its control socket is unless it was given --control-socket")
}

// controlSocket is the socket a client dials: --socket when given, else
// the one serve makes in its --state-dir.
func controlSocket(socket, stateDir string) string {
	if socket != "" {
		return socket
	}
	return phases.Config{StateDir: stateDir}.ControlSocket()
}

// noDaemonHint says, when nothing answers on path, how to point the
// client at the daemon's socket.
func noDaemonHint(path string) string {
	return "no daemon answers on " + path + "; point at its socket with --socket or PHASEGATE_SOCKET, or at its state directory with --state-dir or PHASEGATE_STATE_DIR"
}

// dial connects to the control socket, or to --addr over TLS when given.
func (f *slotsFlags) dial() (*grpc.ClientConn, error) {
	tc, err := f.tls.config()
	if err != nil {
		return nil, err
	}
	creds := insecure.NewCredentials()
	var target string
	switch {
	case f.addr != "":
		target = f.addr
		if tc != nil {
			creds = credentials.NewTLS(tc)
		}
	case tc != nil:
		return nil, errors.New("--tls-ca and --tls-cert are for --addr: the control socket needs none")
	default:
		// gRPC's unix:// target takes an absolute path only: a relative
		// one would be read as an authority ("unix://run/pg.sock").
		sock := controlSocket(f.socket, f.stateDir)
		path, err := filepath.Abs(sock)
		if err != nil {
			return nil, fmt.Errorf("control socket %q: %w", sock, err)
		}
		target = "unix://" + path
	}
	return grpc.NewClient(target, grpc.WithTransportCredentials(creds))
}

// call makes the verb's call with its arguments.
func (f *slotsFlags) call(ctx context.Context, c phasegatev1.SlotsClient, verb string, pos []string) (proto.Message, error) {
	if verb == "acquire" {
		req := &phasegatev1.AcquireRequest{Owner: pos[0], RequestId: f.requestID, EgressPolicy: f.egress.policy(), Ports: f.publish, Bandwidth: f.bandwidth.limits()}
		if f.ttl.set {
			req.Ttl = durationpb.New(f.ttl.d)
		}
		return c.Acquire(ctx, req)
	}
	if verb == "list" {
		return c.List(ctx, &phasegatev1.ListRequest{IncludeFree: f.all})
	}
	i, err := strconv.ParseUint(pos[0], 10, 32)
	if err != nil {
		return nil, fmt.Errorf("index %q is not a number", pos[0])
	}
	switch verb {
	case "release":
		return c.Release(ctx, &phasegatev1.ReleaseRequest{Index: uint32(i), LeaseId: pos[1]})
	case "keepalive":
		return c.KeepAlive(ctx, &phasegatev1.KeepAliveRequest{Index: uint32(i), LeaseId: pos[1]})
	case "egress":
		return c.SetEgressPolicy(ctx, &phasegatev1.SetEgressPolicyRequest{Index: uint32(i), LeaseId: pos[1], EgressPolicy: f.egress.policy()})
	case "ports":
		return c.SetPorts(ctx, &phasegatev1.SetPortsRequest{Index: uint32(i), LeaseId: pos[1], Ports: f.publish})
	case "bandwidth":
		return c.SetBandwidth(ctx, &phasegatev1.SetBandwidthRequest{Index: uint32(i), LeaseId: pos[1], Bandwidth: f.bandwidth.limits()})
	}
	return c.Get(ctx, &phasegatev1.GetRequest{Index: uint32(i)})
}
