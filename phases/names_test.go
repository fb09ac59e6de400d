package phases

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The docs draw the phase graph and list the background tasks (README,
// docs/DESIGN.md §3, this package's doc): every task constant of this
// package is listed there, and nothing else, and every phase is drawn.
func TestDocsNameEveryPhaseAndTask(t *testing.T) {
	tasks := taskNames(t)
	if len(tasks) == 0 {
		t.Fatal("no task constants found in daemon.go")
	}
	phases := []string{PhaseLock, PhaseListen, PhaseReclaim, PhaseStorage, PhasePopulate, PhaseRegister, PhaseServe}
	for _, path := range []string{"../README.md", "../docs/DESIGN.md", "doc.go"} {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(string(b), "\n")
		at := slices.IndexFunc(lines, func(l string) bool { return strings.Contains(l, "└─► background: ") })
		if at < 3 {
			t.Errorf("%s: no phase graph with its background line", path)
			continue
		}
		_, list, _ := strings.Cut(lines[at], "background: ")
		listed := strings.Split(strings.TrimSpace(list), ", ")
		if a, b := slices.Sorted(slices.Values(listed)), slices.Sorted(slices.Values(tasks)); !slices.Equal(a, b) {
			t.Errorf("%s lists the background tasks %v; the code has %v", path, listed, tasks)
		}
		graph := strings.Join(lines[at-3:at], "\n")
		for _, p := range phases {
			if !strings.Contains(graph, p) {
				t.Errorf("%s: the phase graph does not draw %q:\n%s", path, p, graph)
			}
		}
	}
}

// taskNames returns the values of daemon.go's constants named task*.
func taskNames(t *testing.T) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "daemon.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, s := range g.Specs {
			vs := s.(*ast.ValueSpec)
			for i, n := range vs.Names {
				if !strings.HasPrefix(n.Name, "task") || i >= len(vs.Values) {
					continue
				}
				if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
					v, err := strconv.Unquote(lit.Value)
					if err != nil {
						t.Fatal(err)
					}
					out = append(out, v)
				}
			}
		}
	}
	return out
}
