// Package leakcheck fails a test binary whose tests leave goroutines
// running. It does what go.uber.org/goleak's VerifyTestMain does for this
// repository's needs, so that the library's go.mod carries no module that
// only its tests use.
package leakcheck

import (
	"bytes"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// settle bounds the wait for goroutines that are already on their way out
// (a closed connection's reader, a cancelled timer's callback).
const settle = 10 * time.Second

// VerifyTestMain runs the tests and then, if they passed, fails the binary
// when goroutines other than those that existed before the tests are still
// running after a grace period. Use it as a package's TestMain:
//
//	func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }
func VerifyTestMain(m *testing.M) {
	before := ids(stacks())
	code := m.Run()
	if code == 0 {
		if left := Leaked(before, settle); len(left) > 0 {
			fmt.Fprintf(os.Stderr, "leakcheck: %d goroutine(s) still running after the tests:\n\n%s\n",
				len(left), strings.Join(left, "\n\n"))
			code = 1
		}
	}
	os.Exit(code)
}

// Leaked waits up to timeout for every goroutine not in before (and not
// the runtime's or the testing package's own) to end, and returns the
// stacks of those still running.
func Leaked(before map[string]bool, timeout time.Duration) []string {
	deadline := time.Now().Add(timeout)
	delay := time.Millisecond
	for {
		var left []string
		for _, g := range stacks() {
			if !before[id(g)] && !ignored(g) {
				left = append(left, g)
			}
		}
		if len(left) == 0 || time.Now().After(deadline) {
			return left
		}
		time.Sleep(delay)
		delay = min(2*delay, 100*time.Millisecond)
	}
}

// stacks returns one stack trace per goroutine, the caller's included.
func stacks() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var out []string
	for _, g := range bytes.Split(buf, []byte("\n\n")) {
		if s := strings.TrimSpace(string(g)); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// id returns "goroutine N" from a stack's header line.
func id(stack string) string {
	head, _, _ := strings.Cut(stack, " [")
	return head
}

func ids(stacks []string) map[string]bool {
	out := make(map[string]bool, len(stacks))
	for _, s := range stacks {
		out[id(s)] = true
	}
	return out
}

// ignored reports goroutines that belong to the test binary itself: the
// one asking, and those the runtime or os/signal start on first use.
func ignored(stack string) bool {
	if strings.Contains(stack, "internal/leakcheck.stacks(") {
		return true
	}
	top := firstFunc(stack)
	for _, fn := range []string{"os/signal.signal_recv(", "os/signal.loop(", "runtime.ensureSigM(", "testing."} {
		if strings.Contains(top, fn) {
			return true
		}
	}
	return false
}

// firstFunc returns the innermost function line of a stack.
func firstFunc(stack string) string {
	lines := strings.SplitN(stack, "\n", 3)
	if len(lines) < 2 {
		return ""
	}
	return lines[1]
}
