package phasetest_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The package's documentation is what an adopter reads on godoc: every
// name it calls in this module exists, and it points to no test file,
// which godoc does not show.
func TestDocNamesWhatExists(t *testing.T) {
	src, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	f, err := parser.ParseFile(token.NewFileSet(), "doc.go", src, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	doc := f.Doc.Text()
	dirs := map[string]string{"app": "../app", "phasetest": ".", "lifecycle": "../lifecycle", "eventstream": "../eventstream"}
	for _, m := range regexp.MustCompile(`\b(app|phasetest|lifecycle|eventstream)\.([A-Z]\w*)`).FindAllStringSubmatch(doc, -1) {
		if !declared(t, dirs[m[1]], m[2]) {
			t.Errorf("the package doc names %s.%s, which package %s does not declare", m[1], m[2], m[1])
		}
	}
	if m := regexp.MustCompile(`\w+_test\.go`).FindString(doc); m != "" {
		t.Errorf("the package doc points to %s, a test file godoc does not show", m)
	}
}

// declared reports whether the package in dir declares name at top level
// in a file that is not a test.
func declared(t *testing.T, dir, name string) bool {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil && d.Name.Name == name {
					return true
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						if s.Name.Name == name {
							return true
						}
					case *ast.ValueSpec:
						for _, n := range s.Names {
							if n.Name == name {
								return true
							}
						}
					}
				}
			}
		}
	}
	return false
}
