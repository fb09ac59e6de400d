package test

import (
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// module is the library's module path, which `go list` prefixes to every
// package the map names without it.
const module = "github.com/phasegate/phasegate"

// mapRow is one row of docs/DESIGN.md §2's package table.
type mapRow struct {
	names   []string            // the first column's packages or `dir/...` patterns
	planned bool                // "(planned)": a room whose code is not written yet
	below   bool                // "anything below": any package of a lower row
	may     []string            // the last column's names, for every package of the row
	also    map[string][]string // "`p` also …": what the row's package p alone may import besides
}

// TestDesignMapMatchesTheTree checks docs/DESIGN.md §2 against the tree: the
// modules it counts are the go.mod files there are; every package `go list`
// finds has a row and every row names packages that exist (a planned row's
// must not yet); and each package's direct imports of the library (not its
// tests') are in its row's "may import" column and in rows below its own.
func TestDesignMapMatchesTheTree(t *testing.T) {
	section := designMapSection(t)
	checkModules(t, section)
	rows := parseMapRows(t, section)
	imports := libraryImports(t)
	rowOf := func(pkg string) int { return mapRowOf(rows, pkg) }

	for pkg := range imports {
		if rowOf(pkg) < 0 {
			t.Errorf("package %s has no row in docs/DESIGN.md §2", pkg)
		}
	}
	for i, r := range rows {
		for _, n := range r.names {
			exists := slices.ContainsFunc(slices.Collect(maps.Keys(imports)), func(p string) bool { return covers(n, p) && rowOf(p) == i })
			switch {
			case r.planned && exists:
				t.Errorf("docs/DESIGN.md §2's row for %s is marked (planned), but the package exists: remove the mark", n)
			case !r.planned && !exists:
				t.Errorf("docs/DESIGN.md §2 has a row for %s, which is no package of the library", n)
			}
		}
		for member := range r.also {
			if !slices.Contains(r.names, member) {
				t.Errorf("docs/DESIGN.md §2: %s's row says what %s also may import, which is not in the row", r.names[0], member)
			}
		}
		for _, n := range slices.Concat(r.may, slices.Concat(slices.Collect(maps.Values(r.also))...)) {
			if !slices.ContainsFunc(rows, func(o mapRow) bool {
				return slices.ContainsFunc(o.names, func(on string) bool { return covers(n, on) || covers(on, n) })
			}) {
				t.Errorf("docs/DESIGN.md §2: %s's may-import column names %s, which no row describes", r.names[0], n)
			}
		}
	}
	for pkg, imps := range imports {
		i := rowOf(pkg)
		if i < 0 {
			continue
		}
		r := rows[i]
		for _, imp := range imps {
			j := rowOf(imp)
			if j < 0 {
				continue // reported above
			}
			if j <= i {
				t.Errorf("%s imports %s, whose row is not below its own in docs/DESIGN.md §2", pkg, imp)
			}
			if !r.allows(pkg, imp, j > i) {
				t.Errorf("%s imports %s, which its row's may-import column in docs/DESIGN.md §2 does not name", pkg, imp)
			}
		}
	}
}

// designMapSection is docs/DESIGN.md's section 2.
func designMapSection(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../docs/DESIGN.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	start, end := strings.Index(doc, "## 2. Packages: the map"), strings.Index(doc, "\n## 3.")
	if start < 0 || end < start {
		t.Fatal("docs/DESIGN.md has no section 2 followed by a section 3")
	}
	return doc[start:end]
}

// checkModules checks the section's count of modules ("Six modules") and
// that it names the directory of each go.mod but the root's.
func checkModules(t *testing.T, section string) {
	t.Helper()
	out, err := exec.Command("git", "-C", "..", "ls-files", "go.mod", "**/go.mod").Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	mods := strings.Fields(string(out))
	counts := []string{"One", "Two", "Three", "Four", "Five", "Six", "Seven", "Eight", "Nine", "Ten"}
	if len(mods) > len(counts) || !strings.Contains(section, counts[len(mods)-1]+" modules") {
		t.Errorf("docs/DESIGN.md §2 does not say %d modules (%v)", len(mods), mods)
	}
	for _, m := range mods {
		if dir := filepath.Dir(m); dir != "." && !strings.Contains(section, "`"+dir+"/`") {
			t.Errorf("docs/DESIGN.md §2 does not describe the module `%s/`", dir)
		}
	}
}

// parseMapRows reads the table's rows in order, top first.
func parseMapRows(t *testing.T, section string) []mapRow {
	t.Helper()
	name := regexp.MustCompile("`([a-z0-9/._-]+)`")
	names := func(s string) []string {
		var ns []string
		for _, m := range name.FindAllStringSubmatch(s, -1) {
			ns = append(ns, m[1])
		}
		return ns
	}
	also := regexp.MustCompile("^\\s*`([a-z0-9/._-]+)` also (.*)$")
	var rows []mapRow
	for _, line := range strings.Split(section, "\n") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		cells := strings.Split(line, "|")
		if len(cells) < 5 {
			t.Fatalf("docs/DESIGN.md §2: a row without three columns: %s", line)
		}
		r := mapRow{names: names(cells[1]), planned: strings.Contains(cells[1], "(planned)"), also: map[string][]string{}}
		last := cells[len(cells)-2]
		r.below = strings.Contains(last, "anything below")
		for _, seg := range strings.Split(last, ";") {
			if m := also.FindStringSubmatch(seg); m != nil {
				r.also[m[1]] = append(r.also[m[1]], names(m[2])...)
				continue
			}
			r.may = append(r.may, names(seg)...)
		}
		rows = append(rows, r)
	}
	if len(rows) == 0 {
		t.Fatal("docs/DESIGN.md §2 has no package table")
	}
	return rows
}

// libraryImports is each library package's direct imports of the library,
// by path relative to the module, its tests' imports left out.
func libraryImports(t *testing.T) map[string][]string {
	t.Helper()
	out, err := exec.Command("go", "list", "-C", "..", "-f", `{{.ImportPath}} {{join .Imports " "}}`, "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	imports := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		pkg := strings.TrimPrefix(f[0], module+"/")
		imports[pkg] = nil
		for _, imp := range f[1:] {
			if rel, ok := strings.CutPrefix(imp, module+"/"); ok {
				imports[pkg] = append(imports[pkg], rel)
			}
		}
	}
	return imports
}

// covers reports whether a name of the map stands for pkg: the package
// itself, or, written `dir/...`, dir and every package under it (as `go
// list` reads the pattern).
func covers(name, pkg string) bool {
	if dir, ok := strings.CutSuffix(name, "/..."); ok {
		return pkg == dir || strings.HasPrefix(pkg, dir+"/")
	}
	return name == pkg
}

// mapRowOf is the index of pkg's row: the row that names it, or else the
// one whose `dir/...` is the longest that covers it; -1 if none.
func mapRowOf(rows []mapRow, pkg string) int {
	best, bestLen := -1, -1
	for i, r := range rows {
		for _, n := range r.names {
			switch {
			case n == pkg:
				return i
			case covers(n, pkg) && len(n) > bestLen:
				best, bestLen = i, len(n)
			}
		}
	}
	return best
}

// allows reports whether the row lets pkg import imp, which is in a lower
// row when below is true.
func (r mapRow) allows(pkg, imp string, below bool) bool {
	if r.below && below {
		return true
	}
	may := r.may
	for member, extra := range r.also {
		if covers(member, pkg) {
			may = slices.Concat(may, extra)
		}
	}
	return slices.ContainsFunc(may, func(n string) bool { return covers(n, imp) })
}
