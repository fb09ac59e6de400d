package test

import (
	"os/exec"
	"strings"
	"testing"
)

// Every package of the library says what it is in one sentence of at most
// 150 characters (go doc's synopsis); the rest of its doc follows it.
func TestPackageSynopsesAreOneShortSentence(t *testing.T) {
	out, err := exec.Command("go", "list", "-C", "..", "-f", "{{.ImportPath}}\t{{.Doc}}", "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, doc, _ := strings.Cut(line, "\t")
		switch {
		case doc == "":
			t.Errorf("%s has no package doc", pkg)
		case len(doc) > 150:
			t.Errorf("%s: its synopsis is %d characters, want at most 150: %q", pkg, len(doc), doc)
		case !strings.HasSuffix(doc, "."):
			t.Errorf("%s: its synopsis does not end a sentence: %q", pkg, doc)
		}
	}
}
