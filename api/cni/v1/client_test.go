package cniv1_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	cniv1 "github.com/phasegate/phasegate/api/cni/v1"
)

// serve answers every request on a Unix socket with h, through net/http as
// the daemon does, and returns the socket's path.
func serve(t *testing.T, h http.HandlerFunc) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "control.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return path
}

func TestCallReadsEachKindOfAnswer(t *testing.T) {
	for _, tc := range []struct {
		name   string
		code   int
		ctype  string
		body   string
		answer string // the GC answer's released count, when it succeeds
		err    func(error) bool
	}{
		{"answer", 200, "application/json", `{"released": 3}`, "3", nil},
		{"daemon's error", 409, "application/json", `{"code": 101, "msg": "interface name taken"}`, "", func(err error) bool {
			var e *cniv1.Error
			return errors.As(err, &e) && e.Code == cniv1.CodeIfNameTaken && e.Msg == "interface name taken"
		}},
		{"gate while starting", 503, "text/plain", "POST /cni/v1/gc unavailable: starting: phase reclaim 10/50 namespaces\n", "", func(err error) bool {
			var e *cniv1.UnavailableError
			return errors.As(err, &e) && e.Reason == "POST /cni/v1/gc unavailable: starting: phase reclaim 10/50 namespaces"
		}},
		{"unreadable error", 500, "application/json", `{"nope"`, "", func(err error) bool {
			var e *cniv1.Error
			return errors.As(err, &e) && e.Code == cniv1.CodeIOFailure
		}},
		{"text", 429, "text/plain", "slow down", "", func(err error) bool {
			var e *cniv1.Error
			return errors.As(err, &e) && e.Code == cniv1.CodeIOFailure && strings.Contains(e.Error(), "slow down")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sock := serve(t, func(w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(r.Body)
				if r.Method != http.MethodPost || r.URL.Path != cniv1.PathGC || !strings.Contains(string(b), `"network":"pgnet"`) {
					http.Error(w, "unexpected request", http.StatusTeapot)
					return
				}
				w.Header().Set("Content-Type", tc.ctype)
				w.WriteHeader(tc.code)
				_, _ = io.WriteString(w, tc.body)
			})
			var a cniv1.GCAnswer
			err := cniv1.Client{Socket: sock}.Call(context.Background(), cniv1.PathGC, cniv1.GCRequest{Network: "pgnet"}, &a)
			switch {
			case tc.err == nil && (err != nil || a.Released != 3):
				t.Fatalf("Call: %v, released %d", err, a.Released)
			case tc.err != nil && !tc.err(err):
				t.Fatalf("Call: %v (%T)", err, err)
			}
		})
	}
}

// With nobody on the socket, Call says the daemon is unavailable, and
// Wait calls again until it is there.
func TestWaitOutlastsADaemonThatIsNotThereYet(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "control.sock")
	c := cniv1.Client{Socket: sock}
	var un *cniv1.UnavailableError
	if err := c.Call(context.Background(), cniv1.PathStatus, struct{}{}, nil); !errors.As(err, &un) {
		t.Fatalf("Call with no socket: %v, want *UnavailableError", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := c.Wait(ctx, 10*time.Millisecond, cniv1.PathStatus, struct{}{}, nil); !errors.As(err, &un) || !strings.Contains(err.Error(), "waited") {
		t.Fatalf("Wait past its context: %v, want the UnavailableError and how long it waited", err)
	}
	go func() {
		time.Sleep(100 * time.Millisecond)
		l, err := net.Listen("unix", sock)
		if err != nil {
			return
		}
		_ = http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, "{}")
		}))
	}()
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Wait(ctx, 10*time.Millisecond, cniv1.PathStatus, struct{}{}, &cniv1.StatusAnswer{}); err != nil {
		t.Fatalf("Wait for a daemon that comes: %v", err)
	}
}

func TestKeyNamesTheLease(t *testing.T) {
	k := cniv1.Key{Network: "pgnet", ContainerID: "c0ffee", IfName: "eth0"}
	if k.Owner() != "cni/pgnet" || k.RequestID() != "c0ffee/eth0" {
		t.Fatalf("key %+v: owner %q request %q", k, k.Owner(), k.RequestID())
	}
}

func TestEgressIsReadStrictly(t *testing.T) {
	var r cniv1.AddRequest
	err := json.Unmarshal([]byte(`{"network":"n","egress":{"alow":["10.0.0.0/8"]}}`), &r)
	if err == nil || !strings.Contains(err.Error(), "alow") {
		t.Fatalf("a misspelt egress key: %v, want it named", err)
	}
	if err := json.Unmarshal([]byte(`{"egress":{"allow":["10.0.0.0/8"],"denyAll":true}}`), &r); err != nil || !r.Egress.DenyAll || r.Egress.Allow[0] != "10.0.0.0/8" {
		t.Fatalf("a good policy: %v %+v", err, r.Egress)
	}
}
