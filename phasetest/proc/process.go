package proc

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/phasegate/phasegate/app"
	"github.com/phasegate/phasegate/phasetest"
)

// DefaultTimeout bounds [Process.Addr] and [Process.Follow]'s wait for
// the port unless [Timeout] says otherwise: they hold within milliseconds;
// the bound only keeps a broken test from hanging.
const DefaultTimeout = time.Minute

// Option configures [Start].
type Option func(*options)

type options struct {
	args       []string
	env        []string
	timeout    time.Duration
	prepare    []func(*exec.Cmd)
	noAddrFile bool
}

// Args appends command-line arguments.
func Args(args ...string) Option {
	return func(o *options) { o.args = append(o.args, args...) }
}

// Env appends environment variables ("NAME=value"), which the process
// sees besides the test's own environment; a later one wins.
func Env(env ...string) Option {
	return func(o *options) { o.env = append(o.env, env...) }
}

// Timeout bounds the waits for the port ([Process.Addr], [Process.Follow])
// instead of [DefaultTimeout].
func Timeout(d time.Duration) Option {
	return func(o *options) { o.timeout = d }
}

// NoAddrFile leaves [app.AddrFileEnv] out of the process's environment,
// for a process that must see exactly the environment the test gives it
// (a supervisor's, emulated) or that could not write into the test's
// directory (it runs as another user). [Process.Addr] then fails: the test
// knows the address it gave.
func NoAddrFile() Option {
	return func(o *options) { o.noAddrFile = true }
}

// Prepare calls f on the command before it starts: for what the other
// options do not set (SysProcAttr for credentials or a namespace, a
// working directory, extra descriptors). Start then sets Stdout and
// Stderr, and adds its environment to whatever Env f set.
func Prepare(f func(*exec.Cmd)) Option {
	return func(o *options) { o.prepare = append(o.prepare, f) }
}

// Process is a running binary, started by [Start].
type Process struct {
	t        testing.TB
	name     string // the binary's base name, for messages
	cmd      *exec.Cmd
	addrFile string
	timeout  time.Duration
	out      output
	began    time.Time
	done     chan struct{} // closed once the process was reaped
	err      error         // of Wait, once done is closed
	exited   time.Time     // once done is closed
}

// Start runs bin with the options. The process's stdout and stderr are
// kept ([Process.Output]) and logged when the test fails; [app.AddrFileEnv]
// names a file in a directory of the test's. When the test ends, a process
// still running is killed (SIGKILL) and reaped.
func Start(t testing.TB, bin string, opts ...Option) *Process {
	t.Helper()
	o := options{timeout: DefaultTimeout}
	for _, opt := range opts {
		opt(&o)
	}
	p := &Process{t: t, name: filepath.Base(bin), timeout: o.timeout, done: make(chan struct{})}
	p.cmd = exec.Command(bin, o.args...)
	for _, f := range o.prepare {
		f(p.cmd)
	}
	if p.cmd.Env == nil {
		p.cmd.Env = os.Environ()
	}
	if !o.noAddrFile {
		p.addrFile = filepath.Join(t.TempDir(), "addr")
		p.cmd.Env = append(p.cmd.Env, app.AddrFileEnv+"="+p.addrFile)
	}
	p.cmd.Env = append(p.cmd.Env, o.env...)
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
	p.began = time.Now()
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("proc: start %s: %v", bin, err)
	}
	go p.reap()
	t.Cleanup(p.cleanup)
	return p
}

// reap waits for the process; it ends when the process does, which the
// test's cleanup makes sure of.
func (p *Process) reap() {
	err := p.cmd.Wait()
	p.err, p.exited = err, time.Now()
	close(p.done)
}

// cleanup kills a process still running, reaps it, and logs its output
// when the test failed.
func (p *Process) cleanup() {
	select {
	case <-p.done:
	default:
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	if p.t.Failed() {
		p.t.Logf("%s %s output:\n%s", p.name, strings.Join(p.cmd.Args[1:], " "), p.Output())
	}
}

// Output returns what the process wrote to stdout and stderr so far,
// interleaved as written.
func (p *Process) Output() string { return p.out.String() }

// Pid is the process's id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Began is when the process was started.
func (p *Process) Began() time.Time { return p.began }

// Addr waits until the process has reported its port's address (see
// [app.AddrFileEnv]) and returns it as host:port. It fails the test if the
// process exits first or the wait outlasts the process's timeout.
func (p *Process) Addr() string {
	p.t.Helper()
	if p.addrFile == "" {
		p.t.Fatalf("proc: %s was started with NoAddrFile: it reports no address", p.name)
	}
	deadline := time.NewTimer(p.timeout)
	defer deadline.Stop()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		b, err := os.ReadFile(p.addrFile)
		switch {
		case err == nil:
			return strings.TrimSpace(string(b))
		case !errors.Is(err, os.ErrNotExist):
			p.t.Fatalf("proc: reading the address %s reported: %v", p.name, err)
		}
		select {
		case <-p.done:
			p.t.Fatalf("proc: %s exited (%v) before it reported its address", p.name, p.err)
		case <-deadline.C:
			p.t.Fatalf("proc: %s did not report its address within %v", p.name, p.timeout)
		case <-tick.C:
		}
	}
}

// Follow follows the process's lifecycle through its event stream
// ([app.PathEvents] on its port, once [Process.Addr] has it) with
// [phasetest.Follow], for phasetest's waits and assertions.
func (p *Process) Follow(opts ...phasetest.FollowOption) *phasetest.Stream {
	p.t.Helper()
	return phasetest.Follow(p.t, "http://"+p.Addr()+app.PathEvents, opts...)
}

// Signal sends sig to the process and reports whether it still ran: a
// process that has ended already is not an error (a test may race a
// process exiting on its own). Any other failure fails the test.
func (p *Process) Signal(sig syscall.Signal) bool {
	p.t.Helper()
	err := p.cmd.Process.Signal(sig)
	switch {
	case err == nil:
		return true
	case errors.Is(err, os.ErrProcessDone):
		return false
	}
	p.t.Fatalf("proc: signal %v to %s: %v", sig, p.name, err)
	return false
}

// Running reports whether the process has not ended yet.
func (p *Process) Running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Done is closed once the process has ended and been reaped.
func (p *Process) Done() <-chan struct{} { return p.done }

// Wait waits for the process to exit and returns its exit code. It fails
// the test if timeout passes first, or if the process did not exit but was
// ended by a signal ([Process.WaitState] tells those apart).
func (p *Process) Wait(timeout time.Duration) int {
	p.t.Helper()
	st := p.WaitState(timeout)
	if !st.Exited() {
		p.t.Fatalf("proc: %s did not exit: %v", p.name, p.err)
	}
	return st.ExitCode()
}

// WaitState waits for the process to end, however it ended, and returns
// its state; it fails the test if timeout passes first. A process that has
// ended already returns at once, even with a timeout of zero.
func (p *Process) WaitState(timeout time.Duration) *os.ProcessState {
	p.t.Helper()
	if p.Running() { // an ended process is not timed out, whatever the timeout
		deadline := time.NewTimer(timeout)
		defer deadline.Stop()
		select {
		case <-p.done:
		case <-deadline.C:
			p.t.Fatalf("proc: %s did not end within %v", p.name, timeout)
		}
	}
	return p.cmd.ProcessState
}

// Took is how long the process ran, from its start to its end; it fails
// the test if the process has not ended.
func (p *Process) Took() time.Duration {
	p.t.Helper()
	if p.Running() {
		p.t.Fatalf("proc: %s is still running", p.name)
	}
	return p.exited.Sub(p.began)
}

// Err is what waiting for the process returned once it ended (an
// *exec.ExitError for a non-zero exit or a signal, nil for exit 0), and nil
// while it runs.
func (p *Process) Err() error {
	if p.Running() {
		return nil
	}
	return p.err
}

// Exited is when the process was seen to end, zero while it runs.
func (p *Process) Exited() time.Time {
	if p.Running() {
		return time.Time{}
	}
	return p.exited
}

// String names the process, for messages.
func (p *Process) String() string { return fmt.Sprintf("%s (pid %d)", p.name, p.Pid()) }

// output is what the process writes, kept for the test.
type output struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (o *output) Write(b []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.Write(b)
}

func (o *output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.String()
}

// Builds are the binaries a test binary built, each once, and removes at
// its end. Declare one in the test package and run the tests through
// [Builds.Main]:
//
//	var bins proc.Builds
//
//	func TestMain(m *testing.M) { os.Exit(bins.Main(m)) }
//
// The zero value is ready to use; it is safe for concurrent use.
type Builds struct {
	mu      sync.Mutex
	running bool              // Main is running the tests
	dir     string            // where the binaries go, made at the first build
	builds  map[string]*build // by package path
}

type build struct {
	once sync.Once
	path string
	err  error
}

// Main runs the tests, then removes the binaries built, and returns the
// tests' exit code.
func (b *Builds) Main(m *testing.M) int {
	b.mu.Lock()
	b.running = true
	b.mu.Unlock()
	code := m.Run()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.dir != "" {
		if err := os.RemoveAll(b.dir); err != nil {
			fmt.Fprintf(os.Stderr, "proc: removing the binaries built: %v\n", err)
		}
	}
	return code
}

// Build builds the main package pkg (a path such as "." or
// "example.com/svc/cmd/svc", as `go build` takes it, from the test's
// directory) the first time a test asks for it, with -race when the test
// binary has the race detector, and returns the binary's path. A build that
// fails fails every test that asks for it, with the compiler's output. A
// test binary that does not run its tests through [Builds.Main] fails
// here: nothing would remove the binaries.
func (b *Builds) Build(t testing.TB, pkg string) string {
	t.Helper()
	bl, dir, err := b.entry(pkg)
	if err != nil {
		t.Fatal(err)
	}
	bl.once.Do(func() { bl.path, bl.err = goBuild(dir, pkg) })
	if bl.err != nil {
		t.Fatal(bl.err)
	}
	return bl.path
}

// entry returns pkg's build and the directory binaries go to, made now
// if need be.
func (b *Builds) entry(pkg string) (*build, string, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.running {
		return nil, "", fmt.Errorf("proc: Build(%q) outside Builds.Main: call it from TestMain, which removes the binaries", pkg)
	}
	if b.dir == "" {
		dir, err := os.MkdirTemp("", "phasetest-proc-")
		if err != nil {
			return nil, "", fmt.Errorf("proc: a directory for the binaries: %w", err)
		}
		b.dir = dir
	}
	if b.builds == nil {
		b.builds = map[string]*build{}
	}
	bl := b.builds[pkg]
	if bl == nil {
		bl = &build{}
		b.builds[pkg] = bl
	}
	return bl, b.dir, nil
}

// goBuild runs go build for pkg into a directory of its own under dir.
func goBuild(dir, pkg string) (string, error) {
	sub, err := os.MkdirTemp(dir, "bin-")
	if err != nil {
		return "", fmt.Errorf("proc: build %s: %w", pkg, err)
	}
	name := filepath.Base(pkg)
	if name == "." || name == "/" || strings.HasPrefix(name, "..") {
		name = "main"
	}
	path := filepath.Join(sub, name)
	args := []string{"build", "-o", path}
	if Race {
		args = append(args, "-race")
	}
	out, err := exec.Command("go", append(args, pkg)...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("proc: go build %s: %w\n%s", pkg, err, out)
	}
	return path, nil
}
