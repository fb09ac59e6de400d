package test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The house's size limits: a file a reader holds in one sitting, a function
// read in one screen or two. They hold for the whole repository, every
// module and its tests included; generated files (the protobuf code) are
// not written by hand and are left out.
const (
	maxFileLines = 600
	maxFuncLines = 80
)

// TestSourceLimits walks every Go file of the repository and lists each file
// over maxFileLines lines and each function over maxFuncLines lines, with its
// size, so one run names everything to split.
func TestSourceLimits(t *testing.T) {
	root := ".."
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		for _, over := range sourceOverLimits(t, fset, path) {
			t.Error(over)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// sourceOverLimits parses one Go file and returns a line for the file if it
// is too long and one for each function that is; a generated file returns
// nothing.
func sourceOverLimits(t *testing.T, fset *token.FileSet, path string) []string {
	t.Helper()
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := parser.ParseFile(fset, path, src, parser.ParseComments)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if ast.IsGenerated(f) {
		return nil
	}
	name := strings.TrimPrefix(filepath.ToSlash(path), "../")
	var over []string
	if n := strings.Count(string(src), "\n"); n > maxFileLines {
		over = append(over, fmt.Sprintf("file %s has %d lines (limit %d)", name, n, maxFileLines))
	}
	for _, decl := range f.Decls {
		fn, ok := decl.(*ast.FuncDecl)
		if !ok || fn.Body == nil {
			continue
		}
		start, end := fset.Position(fn.Pos()), fset.Position(fn.End())
		if n := end.Line - start.Line + 1; n > maxFuncLines {
			over = append(over, fmt.Sprintf("func %s at %s:%d has %d lines (limit %d)",
				funcName(fn), name, start.Line, n, maxFuncLines))
		}
	}
	return over
}

// funcName spells a function as a reader looks for it: Recv.Name for a
// method, Name otherwise.
func funcName(fn *ast.FuncDecl) string {
	if fn.Recv == nil || len(fn.Recv.List) == 0 {
		return fn.Name.Name
	}
	typ := fn.Recv.List[0].Type
	if star, ok := typ.(*ast.StarExpr); ok {
		typ = star.X
	}
	if idx, ok := typ.(*ast.IndexExpr); ok {
		typ = idx.X
	}
	if idx, ok := typ.(*ast.IndexListExpr); ok {
		typ = idx.X
	}
	if id, ok := typ.(*ast.Ident); ok {
		return id.Name + "." + fn.Name.Name
	}
	return fn.Name.Name
}
