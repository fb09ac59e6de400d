// Package proctest runs an example's binary as a separate process for a
// black-box test: built once per test binary, on a loopback port it binds
// itself, with its stderr kept for assertions and failure messages.
package proctest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sync"
	"syscall"
	"testing"
	"time"
)

var builds sync.Map // package path → *build

// Main runs the tests and then removes the binaries Build made. A test
// package that uses Build calls it from TestMain:
//
//	func TestMain(m *testing.M) { os.Exit(proctest.Main(m)) }
func Main(m *testing.M) int {
	code := m.Run()
	builds.Range(func(_, v any) bool {
		if b := v.(*build); b.path != "" {
			_ = os.RemoveAll(filepath.Dir(b.path))
		}
		return true
	})
	return code
}

type build struct {
	once sync.Once
	path string
	err  error
}

// Build builds the main package pkg (a path such as "." or
// "github.com/…/catalog") once per test binary, with the race detector when
// the test has it, and returns the binary's path. The test package's
// TestMain calls [Main], which removes it at the end.
func Build(t testing.TB, pkg string) string {
	t.Helper()
	v, _ := builds.LoadOrStore(pkg, &build{})
	b := v.(*build)
	b.once.Do(func() {
		dir, err := os.MkdirTemp("", "proctest-")
		if err != nil {
			b.err = err
			return
		}
		// Removed by Main once every test of this binary ran.
		b.path = filepath.Join(dir, filepath.Base(pkg))
		if pkg == "." {
			b.path = filepath.Join(dir, "main")
		}
		args := []string{"build", "-o", b.path}
		if Race {
			args = append(args, "-race")
		}
		out, err := exec.Command("go", append(args, pkg)...).CombinedOutput()
		if err != nil {
			b.err = fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
		}
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}

// Process is a running binary.
type Process struct {
	t      testing.TB
	cmd    *exec.Cmd
	stderr syncBuffer
	done   chan struct{}
	err    error // of Wait, once done is closed
}

// Start runs bin with args and env (added to the test's environment). The
// process is killed, if still running, when the test ends; its stderr is
// logged when the test failed.
func Start(t testing.TB, bin string, env []string, args ...string) *Process {
	t.Helper()
	p := &Process{t: t, done: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout = &p.stderr
	p.cmd.Stderr = &p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("%s output:\n%s", filepath.Base(bin), p.Output())
		}
	})
	return p
}

// Output returns what the process wrote to stdout and stderr so far.
func (p *Process) Output() string { return p.stderr.String() }

var listening = regexp.MustCompile(`msg=listening addr=(\S+)`)

// Addr waits for the process to log the address it listens on (the App's
// "listening" line) and returns it. It fails the test if the process exits
// first or timeout passes.
func (p *Process) Addr(timeout time.Duration) string {
	p.t.Helper()
	deadline := time.After(timeout)
	for {
		wake := p.stderr.changed() // before reading: a write in between wakes us
		if m := listening.FindStringSubmatch(p.Output()); m != nil {
			return m[1]
		}
		select {
		case <-p.done:
			p.t.Fatalf("the process exited (%v) before it listened", p.err)
		case <-deadline:
			p.t.Fatalf("the process did not listen within %s", timeout)
		case <-wake:
		}
	}
}

// Signal sends sig to the process.
func (p *Process) Signal(sig syscall.Signal) {
	p.t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Fatalf("signal %v: %v", sig, err)
	}
}

// Wait waits for the process to exit and returns its exit code; it fails
// the test if timeout passes first or the process did not exit (a signal
// killed it).
func (p *Process) Wait(timeout time.Duration) int {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	select {
	case <-p.done:
	case <-ctx.Done():
		p.t.Fatalf("the process did not exit within %s", timeout)
	}
	var ee *exec.ExitError
	switch {
	case p.err == nil:
		return 0
	case errors.As(p.err, &ee) && ee.Exited():
		return ee.ExitCode()
	}
	p.t.Fatalf("the process ended without exiting: %v", p.err)
	return -1
}

// syncBuffer is a bytes.Buffer written by the process's output copier
// and read by the test, with a channel closed at each write.
type syncBuffer struct {
	mu   sync.Mutex
	b    bytes.Buffer
	wake chan struct{}
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.wake != nil {
		close(s.wake)
		s.wake = nil
	}
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func (s *syncBuffer) changed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.wake == nil {
		s.wake = make(chan struct{})
	}
	return s.wake
}

// Pid is the process's id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// WaitState waits for the process to end, however it ended, and returns
// its state; it fails the test if timeout passes first.
func (p *Process) WaitState(timeout time.Duration) *os.ProcessState {
	p.t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		p.t.Fatalf("the process did not end within %s", timeout)
	}
	return p.cmd.ProcessState
}
