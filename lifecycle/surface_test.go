package lifecycle_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// exportedSurface counts the package's exported names as its godoc lists
// them: types, functions, methods of exported types, constants and
// variables; and, apart, the exported fields of exported structs.
func exportedSurface(t *testing.T) (names, fields int) {
	t.Helper()
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, ent := range entries {
		if !strings.HasSuffix(ent.Name(), ".go") || strings.HasSuffix(ent.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, ent.Name(), nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range f.Decls {
			switch d := decl.(type) {
			case *ast.FuncDecl:
				if !d.Name.IsExported() {
					continue
				}
				if d.Recv == nil || receiverExported(d.Recv.List[0].Type) {
					names++
				}
			case *ast.GenDecl:
				for _, spec := range d.Specs {
					switch s := spec.(type) {
					case *ast.TypeSpec:
						if !s.Name.IsExported() {
							continue
						}
						names++
						if st, ok := s.Type.(*ast.StructType); ok {
							for _, fl := range st.Fields.List {
								for _, n := range fl.Names {
									if n.IsExported() {
										fields++
									}
								}
							}
						}
					case *ast.ValueSpec:
						for _, n := range s.Names {
							if n.IsExported() {
								names++
							}
						}
					}
				}
			}
		}
	}
	return names, fields
}

func receiverExported(x ast.Expr) bool {
	for {
		switch e := x.(type) {
		case *ast.StarExpr:
			x = e.X
		case *ast.IndexExpr:
			x = e.X
		case *ast.IndexListExpr:
			x = e.X
		case *ast.Ident:
			return e.IsExported()
		default:
			return false
		}
	}
}

// docs/FRAMEWORK.md gives the size of the package's exported API beside
// errgroup's and run's; it stays the size the package has.
func TestFrameworkDocCountsTheExportedSurface(t *testing.T) {
	names, fields := exportedSurface(t)
	b, err := os.ReadFile("../docs/FRAMEWORK.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(\d+) exported names \([^)]*?(\d+) with struct fields`).FindSubmatch(b)
	if m == nil {
		t.Fatal(`docs/FRAMEWORK.md no longer says "N exported names (…; M with struct fields"`)
	}
	docNames, _ := strconv.Atoi(string(m[1]))
	docAll, _ := strconv.Atoi(string(m[2]))
	if docNames != names || docAll != names+fields {
		t.Errorf("docs/FRAMEWORK.md counts %d exported names, %d with struct fields; the package has %d and %d",
			docNames, docAll, names, names+fields)
	}
}
