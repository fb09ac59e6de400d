package test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/phasegate/phasegate/phasetest/proc"
)

// consulAgent is a Consul dev agent running inside a node's namespace: it
// reaches the daemon at the node's address, and its own ports are on the
// namespace's loopback, which nothing else on this machine shares.
type consulAgent struct {
	*proc.Process
	n    *node
	http string // host:port of the agent's HTTP API, inside the node
}

// consulBinary is the Consul agent that tools/consul/build.sh builds and
// caches (PHASEGATE_CONSUL), building it on first use if needed. Without
// PHASEGATE_REQUIRE_TOOLS=1 a missing Consul skips the test.
func consulBinary(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("PHASEGATE_CONSUL"); bin != "" {
		return bin
	}
	out, err := exec.Command("../tools/consul/build.sh").Output()
	if err != nil {
		if os.Getenv("PHASEGATE_REQUIRE_TOOLS") == "1" {
			t.Fatalf("building consul: %v", err)
		}
		t.Skipf("consul not available (tools/consul/build.sh: %v)", err)
	}
	return strings.TrimSpace(string(out))
}

// startConsul runs a Consul dev agent in n with its data in a temporary
// directory, and waits until it has elected itself leader. The test's
// clean-up kills it.
func startConsul(t *testing.T, n *node) *consulAgent {
	t.Helper()
	bin := consulBinary(t)
	// Every port the agent opens, picked free inside the node and held
	// until all are picked, so none repeats.
	names := []string{"-http-port", "-dns-port", "-grpc-port", "-serf-lan-port", "-serf-wan-port", "-server-port"}
	var held []net.Listener
	ports := map[string]string{}
	err := n.inNamespace(func() error {
		for _, name := range names {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				return err
			}
			held = append(held, l)
			ports[name] = strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
		}
		return nil
	})
	for _, l := range held {
		l.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
	args := []string{bin, "agent", "-dev", "-bind", "127.0.0.1", "-client", "127.0.0.1",
		"-data-dir", filepath.Join(t.TempDir(), "consul"), "-node", "phasegate-test",
		"-hcl", "disable_update_check = true", "-hcl", "ports { grpc_tls = -1 }"}
	for _, name := range names {
		args = append(args, name, ports[name])
	}
	c := &consulAgent{Process: startCmd(t, n.command(baseEnv(), args...)), n: n, http: "127.0.0.1:" + ports["-http-port"]}
	waitFor(t, 60*time.Second, "consul to elect itself leader", func() bool {
		if !c.Running() {
			t.Fatalf("consul exited: %v", c.Err())
		}
		var leader string
		return c.call("GET", "/v1/status/leader", nil, &leader) == nil && leader != ""
	})
	return c
}

// call does one request to the agent's HTTP API from inside the node,
// sending in as JSON and decoding the answer into out (either may be nil).
func (c *consulAgent) call(method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, "http://"+c.http+path, body)
	if err != nil {
		return err
	}
	tr := &http.Transport{DialContext: c.n.dial, DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, b)
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(b, out)
}

// consulCheckState is one check in /v1/agent/checks.
type consulCheckState struct {
	CheckID, Name, Status, Output, Type string
}

// checks returns the agent's own view of its checks, by ID.
func (c *consulAgent) checks() (map[string]consulCheckState, error) {
	var m map[string]consulCheckState
	err := c.call("GET", "/v1/agent/checks", nil, &m)
	return m, err
}

// consulEvent is a change in one check as the agent shows it.
type consulEvent struct {
	at                    time.Duration // since the daemon's exec
	check, status, output string
}

// consulRecorder polls the agent's checks and keeps every change, so the
// test can ask what Consul showed and when.
type consulRecorder struct {
	mu     sync.Mutex
	events []consulEvent
	last   map[string]consulCheckState
	err    error
}

// record polls c every 50ms from began until stop is closed.
func (r *consulRecorder) record(c *consulAgent, began time.Time, stop <-chan struct{}) {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		m, err := c.checks()
		r.mu.Lock()
		r.err = err
		if err == nil {
			ids := make([]string, 0, len(m))
			for id := range m {
				ids = append(ids, id)
			}
			sort.Strings(ids)
			for _, id := range ids {
				s := m[id]
				if p, ok := r.last[id]; !ok || p.Status != s.Status || p.Output != s.Output {
					r.events = append(r.events, consulEvent{time.Since(began), id, s.Status, s.Output})
				}
			}
			r.last = m
		}
		r.mu.Unlock()
		select {
		case <-stop:
			return
		case <-tick.C:
		}
	}
}

// find returns the index of the first event at or after from for check id
// that match says is the one, or -1.
func (r *consulRecorder) find(from int, id string, match func(consulEvent) bool) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := from; i < len(r.events); i++ {
		if r.events[i].check == id && match(r.events[i]) {
			return i
		}
	}
	return -1
}

func (r *consulRecorder) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.events)
}

// timeline renders the events from index from on, one line each.
func (r *consulRecorder) timeline(from int) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	for _, e := range r.events[from:] {
		out := e.output
		if o := healthOutput(out); o != "" {
			out = "output: " + o
		}
		if len(out) > 160 {
			out = out[:160] + "…"
		}
		fmt.Fprintf(&b, "%8s %-18s %-8s %s\n", e.at.Round(10*time.Millisecond), e.check, e.status, strings.ReplaceAll(out, "\n", " "))
	}
	return b.String()
}

// healthOutputRe finds the output in the verdict /health's body ends with.
var healthOutputRe = regexp.MustCompile(`"verdict":\{(?:"output":("(?:[^"\\]|\\.)*"),)?"status":"(\w+)"\}\}\s*$`)

// healthOutput returns what an HTTP check's Output says of the daemon's
// state: the output of /health's verdict, or its status when the verdict has
// no output (pass); "" when Output is not a /health body.
func healthOutput(consulOutput string) string {
	m := healthOutputRe.FindStringSubmatch(consulOutput)
	if m == nil {
		return ""
	}
	if m[1] == "" {
		return m[2]
	}
	var s string
	if err := json.Unmarshal([]byte(m[1]), &s); err != nil {
		return ""
	}
	return s
}
