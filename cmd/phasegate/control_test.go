package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
	"github.com/phasegate/phasegate/phases"
)

// The quota of leases a principal may hold: --max-leases or the policy
// file's max_leases when said (0: none), from the environment as from
// the command line; unsaid, a quarter of --slots, at least one.
func TestMaxLeasesResolved(t *testing.T) {
	dir := t.TempDir()
	file := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	with := file("with.json", `{"max_leases": 5, "principals": []}`)
	zero := file("zero.json", `{"max_leases": 0, "principals": []}`)
	without := file("without.json", `{"principals": []}`)
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want int
	}{
		{"unset: a quarter of the default 1024 slots", nil, nil, 256},
		{"unset: a quarter of --slots", []string{"--slots=16"}, nil, 4},
		{"unset: at least one", []string{"--slots=3"}, nil, 1},
		{"--max-leases=0 is no limit", []string{"--slots=16", "--max-leases=0"}, nil, 0},
		{"--max-leases", []string{"--slots=16", "--max-leases=10"}, nil, 10},
		{"PHASEGATE_MAX_LEASES", []string{"--slots=16"}, map[string]string{"PHASEGATE_MAX_LEASES": "7"}, 7},
		{"PHASEGATE_MAX_LEASES=0", []string{"--slots=16"}, map[string]string{"PHASEGATE_MAX_LEASES": "0"}, 0},
		{"the file's", []string{"--slots=16", "--control-policy=" + with}, nil, 5},
		{"the file's 0", []string{"--slots=16", "--control-policy=" + zero}, nil, 0},
		{"a file without", []string{"--slots=16", "--control-policy=" + without}, nil, 4},
		{"the flag over the file", []string{"--slots=16", "--control-policy=" + with, "--max-leases=9"}, nil, 9},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := env{args: tc.args, lookupEnv: envFrom(tc.env), stdout: &bytes.Buffer{}, stderr: &bytes.Buffer{}}
			cfg, _, err := serveFlags(e)
			if err != nil {
				t.Fatal(err)
			}
			if got := cfg.ControlPolicy().Quota(); got != tc.want {
				t.Errorf("quota %d, want %d", got, tc.want)
			}
		})
	}
}

// Unset, --slots is what --slot-cidr holds (a /31 each) up to the
// default, and the quota of leases a quarter of that; a --slots given is
// kept, and one the CIDR cannot hold refused as before.
func TestSlotsFitTheCIDR(t *testing.T) {
	for _, tc := range []struct {
		name      string
		args      []string
		env       map[string]string
		slots     int
		maxLeases int
		invalid   string // in Validate's error; "" when valid
	}{
		{"no CIDR: the default", nil, nil, 1024, 256, ""},
		{"a /24 holds 128", []string{"--slot-cidr=10.99.0.0/24"}, nil, 128, 32, ""},
		{"PHASEGATE_SLOT_CIDR", nil, map[string]string{"PHASEGATE_SLOT_CIDR": "10.99.0.0/24"}, 128, 32, ""},
		{"a /16: capped at the default", []string{"--slot-cidr=10.99.0.0/16"}, nil, 1024, 256, ""},
		{"--slots given and fitting", []string{"--slot-cidr=10.99.0.0/24", "--slots=100"}, nil, 100, 25, ""},
		{"PHASEGATE_SLOTS given", []string{"--slot-cidr=10.99.0.0/24"}, map[string]string{"PHASEGATE_SLOTS": "64"}, 64, 16, ""},
		{"--slots given and too many", []string{"--slot-cidr=10.99.0.0/24", "--slots=1024"}, nil, 1024, 256, "holds 256 addresses, 1024 slots need 2048"},
		{"a /32 holds none", []string{"--slot-cidr=10.99.0.1/32"}, nil, 1024, 256, "too small for one /31"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := env{args: append(tc.args, "--pool-size=4"), lookupEnv: envFrom(tc.env), stdout: &bytes.Buffer{}, stderr: &bytes.Buffer{}}
			cfg, _, err := serveFlags(e)
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Slots.Slots != tc.slots {
				t.Errorf("--slots %d, want %d", cfg.Slots.Slots, tc.slots)
			}
			if got := cfg.ControlPolicy().Quota(); got != tc.maxLeases {
				t.Errorf("quota %d, want %d", got, tc.maxLeases)
			}
			err = cfg.Slots.Validate()
			switch {
			case tc.invalid == "" && err != nil:
				t.Errorf("invalid: %v", err)
			case tc.invalid != "" && (err == nil || !strings.Contains(err.Error(), tc.invalid)):
				t.Errorf("Validate: %v, want %q", err, tc.invalid)
			}
		})
	}
}

// The slots client takes its flags from the environment when the command
// line leaves them (a verb with no argument too), and dials a relative
// --socket as the absolute path it names.
func TestSlotsSocket(t *testing.T) {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want string // the socket the client dials
	}{
		{"the default", []string{"list"}, nil, "unix:///run/phasegate/control.sock"},
		{"PHASEGATE_SOCKET, a verb without arguments", []string{"list"}, map[string]string{"PHASEGATE_SOCKET": "/tmp/a.sock"}, "unix:///tmp/a.sock"},
		{"PHASEGATE_SOCKET, a verb with arguments", []string{"get", "3"}, map[string]string{"PHASEGATE_SOCKET": "/tmp/a.sock"}, "unix:///tmp/a.sock"},
		{"--socket over PHASEGATE_SOCKET", []string{"list", "--socket=/tmp/b.sock"}, map[string]string{"PHASEGATE_SOCKET": "/tmp/a.sock"}, "unix:///tmp/b.sock"},
		{"a relative --socket", []string{"list", "--socket=run/pg.sock"}, nil, "unix://" + filepath.Join(wd, "run/pg.sock")},
		{"a relative PHASEGATE_SOCKET", []string{"list"}, map[string]string{"PHASEGATE_SOCKET": "./pg.sock"}, "unix://" + filepath.Join(wd, "pg.sock")},
		{"--state-dir's socket", []string{"list", "--state-dir=/tmp/pg-b"}, nil, "unix:///tmp/pg-b/control.sock"},
		{"PHASEGATE_STATE_DIR's socket", []string{"list"}, map[string]string{"PHASEGATE_STATE_DIR": "/tmp/pg-b"}, "unix:///tmp/pg-b/control.sock"},
		{"--socket over --state-dir", []string{"list", "--state-dir=/tmp/pg-b", "--socket=/tmp/b.sock"}, nil, "unix:///tmp/b.sock"},
		{"PHASEGATE_SOCKET over --state-dir", []string{"list", "--state-dir=/tmp/pg-b"}, map[string]string{"PHASEGATE_SOCKET": "/tmp/a.sock"}, "unix:///tmp/a.sock"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs, f := newSlotsFlagSet()
			if _, _, err := slotsVerbs().parse(fs, env{lookupEnv: envFrom(tc.env), stdout: &bytes.Buffer{}}, tc.args); err != nil {
				t.Fatal(err)
			}
			conn, err := f.dial()
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if got := conn.Target(); got != tc.want {
				t.Errorf("dials %q, want %q", got, tc.want)
			}
		})
	}
}

// "slots" and "held" find the control socket of the --state-dir they are
// given, and where nothing answers they say the path they tried and how
// to point at another.
func TestClientsFindTheStateDirsSocket(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, phases.ControlSocketName)
	run := func(cmd func(context.Context, env) int, args ...string) (int, string) {
		var stderr bytes.Buffer
		code := cmd(context.Background(), env{args: args, lookupEnv: envFrom(nil), stdout: &bytes.Buffer{}, stderr: &stderr})
		return code, stderr.String()
	}
	// Nothing listens: the error names the socket and the way out.
	for _, c := range []struct {
		name string
		cmd  func(context.Context, env) int
	}{{"slots", slotsCmd}, {"held", heldCmd}} {
		code, stderr := run(c.cmd, "list", "--state-dir="+dir, "--timeout=5s")
		if code != exitFailed || !strings.Contains(stderr, sock) || !strings.Contains(stderr, "--state-dir") || !strings.Contains(stderr, "PHASEGATE_SOCKET") {
			t.Errorf("%s list with no daemon: exit %d, %q; want 1 naming %s and --socket, PHASEGATE_SOCKET, --state-dir", c.name, code, stderr, sock)
		}
	}

	// Something answers there: a gRPC server with no Slots of its own
	// answers Unimplemented, and the held routes an empty list.
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	phasegatev1.RegisterSlotsServer(gs, phasegatev1.UnimplementedSlotsServer{})
	done := make(chan error, 1)
	go func() { done <- gs.Serve(l) }()
	code, stderr := run(slotsCmd, "list", "--state-dir="+dir, "--timeout=5s")
	gs.Stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if code != exitFailed || !strings.Contains(stderr, "Unimplemented") {
		t.Errorf("slots list --state-dir=%s: exit %d, %q; want the server's Unimplemented", dir, code, stderr)
	}

	l, err = net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("{}")) })}
	go func() { done <- hs.Serve(l) }()
	code, stderr = run(heldCmd, "list", "--state-dir="+dir, "--timeout=5s")
	_ = hs.Close()
	if err := <-done; !errors.Is(err, http.ErrServerClosed) {
		t.Fatal(err)
	}
	if code != exitOK {
		t.Errorf("held list --state-dir=%s: exit %d, %q; want 0", dir, code, stderr)
	}
}

// "held list" reads PHASEGATE_SOCKET as "slots list" does: the flags are
// parsed, and so taken from the environment, with no argument after the
// verb too.
func TestHeldVerbWithoutArgumentsReadsTheEnvironment(t *testing.T) {
	fs := flag.NewFlagSet("held", flag.ContinueOnError)
	socket := fs.String("socket", "/run/phasegate/control.sock", "")
	e := env{lookupEnv: envFrom(map[string]string{"PHASEGATE_SOCKET": "/tmp/a.sock"}), stdout: &bytes.Buffer{}}
	verb, pos, err := heldVerbs().parse(fs, e, []string{"list"})
	if err != nil || verb != "list" || len(pos) != 0 {
		t.Fatalf("parse = %q, %q, %v", verb, pos, err)
	}
	if *socket != "/tmp/a.sock" {
		t.Errorf("--socket is %q, want PHASEGATE_SOCKET's /tmp/a.sock", *socket)
	}
}
