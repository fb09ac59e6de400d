package proc

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

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
