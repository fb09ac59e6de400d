package healthtest

import (
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// NotifySocket listens on a unixgram socket the way systemd does, sets
// NOTIFY_SOCKET to it and collects every line received.
type NotifySocket struct {
	path  string
	mu    sync.Mutex
	lines []string
	got   chan struct{} // signalled after each datagram
	marks int
}

// ListenNotify listens on a socket in t's temporary directory and sets
// NOTIFY_SOCKET to it for the rest of the test.
func ListenNotify(t *testing.T) *NotifySocket {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("NOTIFY_SOCKET", path)
	ns := &NotifySocket{path: path, got: make(chan struct{}, 1)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 4096)
		for {
			n, _, err := conn.ReadFrom(buf)
			if err != nil {
				return
			}
			ns.mu.Lock()
			ns.lines = append(ns.lines, strings.Split(string(buf[:n]), "\n")...)
			ns.mu.Unlock()
			select {
			case ns.got <- struct{}{}:
			default:
			}
		}
	}()
	t.Cleanup(func() {
		_ = conn.Close()
		<-done
	})
	return ns
}

// Snapshot returns the lines received so far.
func (ns *NotifySocket) Snapshot() []string {
	ns.mu.Lock()
	defer ns.mu.Unlock()
	return slices.Clone(ns.lines)
}

// Arrived is signalled after each datagram, for a test that polls a
// condition of its own on the lines.
func (ns *NotifySocket) Arrived() <-chan struct{} { return ns.got }

// BeforeMark returns every line received before a new mark. Not
// Snapshot()[:Mark(t)]: operands are evaluated left to right, so that
// snapshot is taken before the mark arrives and can be shorter than it
// (a panic seen in CI).
func (ns *NotifySocket) BeforeMark(t *testing.T) []string {
	t.Helper()
	m := ns.Mark(t)
	return ns.Snapshot()[:m]
}

// Mark sends a line of its own to the socket and waits for it: every
// datagram sent before mark was called has then been received, so the
// lines before the mark are all there are.
func (ns *NotifySocket) Mark(t *testing.T) int {
	t.Helper()
	ns.marks++
	line := fmt.Sprintf("MARK=%d", ns.marks)
	c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: ns.path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte(line)); err != nil {
		t.Fatal(err)
	}
	ns.WaitLine(t, line, func(l string) bool { return l == line })
	return slices.Index(ns.Snapshot(), line)
}

// WaitLine waits until a line for which match holds has arrived.
func (ns *NotifySocket) WaitLine(t *testing.T, what string, match func(string) bool) {
	t.Helper()
	deadline := time.After(Wait)
	for {
		if slices.ContainsFunc(ns.Snapshot(), match) {
			return
		}
		select {
		case <-ns.got:
		case <-deadline:
			t.Fatalf("no sd_notify line %s; got %q", what, ns.Snapshot())
		}
	}
}
