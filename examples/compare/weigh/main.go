// Command weigh measures the minimal service of package compare/minimal
// on each wiring, in one run, and prints the table of docs/FRAMEWORK.md:
// its lines of wiring, the binary's size (plain and stripped), the modules
// linked into it (go version -m), the modules of its module graph (go list
// -m all in a module of its own that requires only what the service
// imports, as an adopter's would), the time from exec to the first 200 of
// its /health, and from exec to exit when the config step fails (medians
// of -runs, with each wiring's default drain delay), and how it ends when
// SIGTERM arrives during its start (its config step made to take 5 s with
// -slow). Run it from the examples module:
//
//	go run ./compare/weigh
//	go run ./compare/weigh -before /tmp/before # also phasegate at an older tree
//
// where /tmp/before holds an older tree of the repository (git archive
// REF | tar -x -C /tmp/before). It builds in temporary directories, with
// GOPROXY=off: every module it links comes from the module cache, which
// building the examples module fills; listing the module graph asks the
// proxy for the go.mod files of modules nothing links.
package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

const phasegateModule = "github.com/phasegate/phasegate"

// wiring is one row: the minimal service's package, and the tree of
// phasegate it builds against (empty: the examples module's).
type wiring struct {
	name, pkg, root string
}

// weight is what the table reports for one wiring.
type weight struct {
	lines      int // of wiring in main.go
	size       int64
	stripped   int64 // built with -ldflags=-s -w
	linked     int
	graph      int
	serving    time.Duration // exec → the first 200 from GET /health
	failFast   time.Duration
	failedWith int    // the exit code of the failing runs
	signalled  string // how a SIGTERM during the start ends it
}

func main() {
	before := flag.String("before", "", "a tree of the repository to measure phasegate at too")
	runs := flag.Int("runs", 5, "failing starts per wiring; the median is reported")
	flag.Parse()
	if err := weighAll(context.Background(), *before, *runs); err != nil {
		fmt.Fprintln(os.Stderr, "weigh:", err)
		os.Exit(1)
	}
}

func weighAll(ctx context.Context, before string, runs int) error {
	root, err := goOut(ctx, "", "list", "-m", "-f", "{{.Dir}}", phasegateModule)
	if err != nil {
		return err
	}
	const min = "github.com/phasegate/phasegate/examples/compare/minimal/"
	wirings := []wiring{
		{"phasegate", min + "pgmin", root},
		{"fx", min + "fxmin", ""},
		{"run", min + "runmin", ""},
	}
	if before != "" {
		abs, err := filepath.Abs(before)
		if err != nil {
			return err
		}
		wirings = slices.Insert(wirings, 0, wiring{"phasegate (" + filepath.Base(abs) + ")", min + "pgmin", abs})
	}
	fmt.Println("| minimal service | lines of wiring | binary | stripped | linked modules | module graph | exec → serving (`/health` 200) | exec → exit, config failing | SIGTERM during the start |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|")
	for _, w := range wirings {
		m, err := weighOne(ctx, w, runs)
		if err != nil {
			return fmt.Errorf("%s: %w", w.name, err)
		}
		fmt.Printf("| %s | %d | %.1f MB | %.1f MB | %d | %d | %s | %s (exit %d) | %s |\n", w.name, m.lines, float64(m.size)/1e6, float64(m.stripped)/1e6,
			m.linked, m.graph, m.serving.Round(100*time.Microsecond), m.failFast.Round(100*time.Microsecond), m.failedWith, m.signalled)
	}
	return nil
}

// weighOne builds the wiring's service in a module of its own and
// measures it.
func weighOne(ctx context.Context, w wiring, runs int) (weight, error) {
	dir, err := os.MkdirTemp("", "weigh-")
	if err != nil {
		return weight{}, err
	}
	defer os.RemoveAll(dir)
	if err := writeModule(ctx, dir, w); err != nil {
		return weight{}, err
	}
	bin := filepath.Join(dir, "service")
	if _, err := goOut(ctx, dir, "build", "-o", bin, "."); err != nil {
		return weight{}, err
	}
	stripped := filepath.Join(dir, "service-stripped")
	if _, err := goOut(ctx, dir, "build", "-ldflags=-s -w", "-o", stripped, "."); err != nil {
		return weight{}, err
	}
	var m weight
	if m.lines, err = wiringLines(filepath.Join(dir, "main.go")); err != nil {
		return weight{}, err
	}
	if m.size, err = sizeOf(bin); err != nil {
		return weight{}, err
	}
	if m.stripped, err = sizeOf(stripped); err != nil {
		return weight{}, err
	}
	if m.serving, err = toServing(ctx, bin, runs); err != nil {
		return weight{}, err
	}
	if m.linked, err = linkedModules(ctx, bin); err != nil {
		return weight{}, err
	}
	// The graph needs every go.mod in it, not only the built modules':
	// those may not be in the module cache, so this asks the proxy.
	all, err := goOnline(ctx, dir, "list", "-m", "all")
	if err != nil {
		return weight{}, err
	}
	m.graph = len(strings.Split(all, "\n")) - 1 // not the service's own module
	if m.failFast, m.failedWith, err = failFast(ctx, bin, runs); err != nil {
		return weight{}, err
	}
	m.signalled, err = signalDuringStart(ctx, bin, runs)
	return m, err
}

// writeModule makes dir a module holding the service's main.go that
// requires, at the versions the examples module selects, the modules the
// service links, so that every one is in the module cache; phasegate is
// replaced by the wiring's tree.
func writeModule(ctx context.Context, dir string, w wiring) error {
	src, err := goOut(ctx, "", "list", "-f", "{{.Dir}}", w.pkg)
	if err != nil {
		return err
	}
	mods, err := goOut(ctx, "", "list", "-deps", "-f", "{{with .Module}}{{if not .Main}}{{.Path}} {{.Version}}{{end}}{{end}}", w.pkg)
	if err != nil {
		return err
	}
	var gomod strings.Builder
	fmt.Fprintf(&gomod, "module weigh/service\n\ngo 1.26.0\n\nrequire (\n")
	seen := map[string]bool{}
	for line := range strings.SplitSeq(mods, "\n") {
		if line == "" || seen[line] {
			continue
		}
		seen[line] = true
		if strings.HasPrefix(line, phasegateModule+" ") {
			line = phasegateModule + " v0.0.0"
		}
		fmt.Fprintf(&gomod, "\t%s\n", line)
	}
	gomod.WriteString(")\n")
	if w.root != "" {
		fmt.Fprintf(&gomod, "\nreplace %s => %s\n", phasegateModule, w.root)
	}
	sum, err := goOut(ctx, "", "env", "GOMOD")
	if err != nil {
		return err
	}
	sums, err := os.ReadFile(filepath.Join(filepath.Dir(sum), "go.sum"))
	if err != nil {
		return err
	}
	main, err := os.ReadFile(filepath.Join(src, "main.go"))
	if err != nil {
		return err
	}
	return errors.Join(
		os.WriteFile(filepath.Join(dir, "go.mod"), []byte(gomod.String()), 0o644),
		os.WriteFile(filepath.Join(dir, "go.sum"), sums, 0o644),
		os.WriteFile(filepath.Join(dir, "main.go"), main, 0o644),
	)
}

// linkedModules counts the modules go version -m lists as linked into bin
// ("dep" lines; a replaced module counts once).
func linkedModules(ctx context.Context, bin string) (int, error) {
	out, err := goOut(ctx, "", "version", "-m", bin)
	if err != nil {
		return 0, err
	}
	n := 0
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) > 0 && f[0] == "dep" {
			n++
		}
	}
	return n, sc.Err()
}

// failFast runs bin -fail runs times and returns the median time from
// exec to exit, and the exit code, which must be the same each time.
func failFast(ctx context.Context, bin string, runs int) (time.Duration, int, error) {
	var took []time.Duration
	code := -1
	for range runs {
		cmd := exec.CommandContext(ctx, bin, "-fail")
		began := time.Now()
		err := cmd.Run()
		took = append(took, time.Since(began))
		var exit *exec.ExitError
		if !errors.As(err, &exit) {
			return 0, 0, fmt.Errorf("%s -fail: %v, want a non-zero exit", bin, err)
		}
		if code != -1 && exit.ExitCode() != code {
			return 0, 0, fmt.Errorf("%s -fail: exit %d, then %d", bin, code, exit.ExitCode())
		}
		code = exit.ExitCode()
	}
	slices.Sort(took)
	return took[len(took)/2], code, nil
}

// signalDuringStart runs bin runs times with its config step taking 5 s,
// sends it SIGTERM 300 ms after exec, well into that step, and says how it
// ended, which must be the same each time, and the median time from the
// signal to its end.
func signalDuringStart(ctx context.Context, bin string, runs int) (string, error) {
	var took []time.Duration
	how := ""
	for range runs {
		addr, err := freeAddr()
		if err != nil {
			return "", err
		}
		cmd := exec.CommandContext(ctx, bin, "-listen", addr, "-slow", "5s")
		if err := cmd.Start(); err != nil {
			return "", err
		}
		time.Sleep(300 * time.Millisecond)
		signalled := time.Now()
		if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
			return "", err
		}
		_ = cmd.Wait() // how it ended is in its state
		took = append(took, time.Since(signalled))
		ended := fmt.Sprintf("exit %d", cmd.ProcessState.ExitCode())
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			ended = "killed by " + ws.Signal().String()
			if ws.Signal() == syscall.SIGTERM {
				ended = "killed by the signal"
			}
		}
		if how != "" && ended != how {
			return "", fmt.Errorf("%s: SIGTERM during the start: %s, then %s", bin, how, ended)
		}
		how = ended
	}
	slices.Sort(took)
	return fmt.Sprintf("%s, %s after it", how, took[len(took)/2].Round(100*time.Microsecond)), nil
}

// freeAddr is a loopback address with a port nothing listens on.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

func sizeOf(path string) (int64, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}

// wiringLines counts the lines of Go in path that are neither blank,
// comments, the package clause nor imports, as docs/FRAMEWORK.md counts
// the catalogs'.
func wiringLines(path string) (int, error) {
	src, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	n, inImports, inComment := 0, false, false
	for line := range strings.SplitSeq(string(src), "\n") {
		l := strings.TrimSpace(line)
		switch {
		case inComment:
			inComment = !strings.Contains(l, "*/")
		case strings.HasPrefix(l, "/*"):
			inComment = !strings.Contains(l, "*/")
		case inImports:
			inImports = l != ")"
		case l == "import (":
			inImports = true
		case l == "", strings.HasPrefix(l, "//"), strings.HasPrefix(l, "package "), strings.HasPrefix(l, "import "):
		default:
			n++
		}
	}
	return n, nil
}

// toServing runs bin on a free loopback port runs times and returns the
// median time from exec to the first 200 its GET /health answers, asked
// every 200µs; each run is then stopped with SIGTERM.
func toServing(ctx context.Context, bin string, runs int) (time.Duration, error) {
	var took []time.Duration
	client := &http.Client{Timeout: time.Second}
	defer client.CloseIdleConnections()
	for range runs {
		addr, err := freeAddr()
		if err != nil {
			return 0, err
		}
		cmd := exec.CommandContext(ctx, bin, "-listen", addr)
		began := time.Now()
		if err := cmd.Start(); err != nil {
			return 0, err
		}
		served := time.Duration(0)
		for deadline := began.Add(30 * time.Second); served == 0 && time.Now().Before(deadline); {
			if resp, err := client.Get("http://" + addr + "/health"); err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					served = time.Since(began)
					break
				}
			}
			time.Sleep(200 * time.Microsecond)
		}
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		if served == 0 {
			return 0, fmt.Errorf("%s: /health never answered 200 within 30s", bin)
		}
		took = append(took, served)
	}
	slices.Sort(took)
	return took[len(took)/2], nil
}

// goOut runs the go command in dir (the current one when empty), offline,
// and returns its trimmed output.
func goOut(ctx context.Context, dir string, args ...string) (string, error) {
	return goEnv(ctx, dir, []string{"GOPROXY=off"}, args...)
}

// goOnline is goOut with the environment's GOPROXY.
func goOnline(ctx context.Context, dir string, args ...string) (string, error) {
	return goEnv(ctx, dir, nil, args...)
}

// goEnv runs the go command in dir with env added, and returns its trimmed
// output.
func goEnv(ctx context.Context, dir string, env []string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = dir
	cmd.Env = append(append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off"), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(string(out)), nil
}
