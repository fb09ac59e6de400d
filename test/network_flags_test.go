package test

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestNetworkNamesNoDaemonFlag: the network layer takes values, never
// flags (docs/DESIGN.md §2): no non-test file under network/ names a flag
// of `phasegate serve`, in code or in a comment. The daemon turns flags
// into configuration and maps network.SettingError to its flag names
// (phases/internal/flagname). The flags are read from the binary's own
// help, so a flag added later is checked too.
func TestNetworkNamesNoDaemonFlag(t *testing.T) {
	help, err := exec.Command(binary, "serve", "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("phasegate serve --help: %v\n%s", err, help)
	}
	var flags []string
	for _, m := range regexp.MustCompile(`(?m)^\s+--([a-z0-9-]+)`).FindAllStringSubmatch(string(help), -1) {
		flags = append(flags, regexp.QuoteMeta(m[1]))
	}
	if len(flags) < 10 {
		t.Fatalf("only %d flags in phasegate serve --help:\n%s", len(flags), help)
	}
	named := regexp.MustCompile(`--(` + strings.Join(flags, "|") + `)\b`)
	err = filepath.WalkDir("../network", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for i, line := range strings.Split(string(src), "\n") {
			if m := named.FindString(line); m != "" {
				t.Errorf("%s:%d names the daemon's flag %s: %s", path, i+1, m, strings.TrimSpace(line))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
