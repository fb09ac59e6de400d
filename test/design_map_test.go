package test

import (
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// docs/DESIGN.md §2's package table is the map of the library module: every
// package `go list` finds has a row (a `dir/...` row covers a directory's
// packages), and every row names packages that exist.
func TestDesignMapMatchesTheTree(t *testing.T) {
	out, err := exec.Command("go", "list", "-C", "..", "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	const module = "github.com/phasegate/phasegate"
	var pkgs []string
	for _, p := range strings.Fields(string(out)) {
		pkgs = append(pkgs, strings.TrimPrefix(strings.TrimPrefix(p, module), "/"))
	}
	b, err := os.ReadFile("../docs/DESIGN.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	start, end := strings.Index(doc, "## 2. Packages: the map"), strings.Index(doc, "\n## 3.")
	if start < 0 || end < start {
		t.Fatal("docs/DESIGN.md has no section 2 followed by a section 3")
	}
	var rows []string
	name := regexp.MustCompile("`([a-z0-9/._-]+)`")
	for _, line := range strings.Split(doc[start:end], "\n") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		first := strings.Split(line, "|")[1]
		for _, m := range name.FindAllStringSubmatch(first, -1) {
			rows = append(rows, m[1])
		}
	}
	covers := func(row, pkg string) bool {
		if dir, ok := strings.CutSuffix(row, "/..."); ok {
			return strings.HasPrefix(pkg, dir+"/") && !strings.Contains(strings.TrimPrefix(pkg, dir+"/"), "/")
		}
		return row == pkg
	}
	for _, p := range pkgs {
		if !slices.ContainsFunc(rows, func(r string) bool { return covers(r, p) }) {
			t.Errorf("package %s has no row in docs/DESIGN.md §2", p)
		}
	}
	for _, r := range rows {
		if !slices.ContainsFunc(pkgs, func(p string) bool { return covers(r, p) }) {
			t.Errorf("docs/DESIGN.md §2 has a row for %s, which is no package of the library", r)
		}
	}
}
