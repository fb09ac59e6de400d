package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestRunsAndLeavesNothing runs the command as docs/BENCHMARKS.md shows
// it, with two containers and one rep, and checks what it prints (every
// side measured) and that nothing of it is left: no link or namespace
// file of its prefix, no mount of its directories. It asserts no timing.
func TestRunsAndLeavesNothing(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("PHASEGATE_REQUIRE_TOOLS") == "1" {
			t.Fatal("the command needs root")
		}
		t.Skip("the command needs root")
	}
	for _, p := range []string{"portmap", "bandwidth"} {
		if _, err := os.Stat(filepath.Join("/usr/lib/cni", p)); err != nil {
			if os.Getenv("PHASEGATE_REQUIRE_TOOLS") == "1" {
				t.Fatalf("the reference %s plugin: %v (tools/deps.sh installs it)", p, err)
			}
			t.Skipf("the reference %s plugin: %v", p, err)
		}
	}
	bin := filepath.Join(t.TempDir(), "cnichain")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "-containers", "2", "-reps", "1").CombinedOutput()
	if err != nil {
		t.Fatalf("cnichain: %v\n%s", err, out)
	}
	for _, s := range sides {
		row := regexp.MustCompile(`(?m)^\| ` + regexp.QuoteMeta(s.name) + ` \| [1-9][0-9.]* ms \| [0-9.]+ ms \| [1-9][0-9.]* ms \| [0-9.]+ ms \|$`)
		if !row.Match(out) {
			t.Errorf("no row of %q with its figures in:\n%s", s.name, out)
		}
	}
	links, err := exec.Command("ip", "-o", "link", "show").CombinedOutput()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(links), prefix) {
		t.Errorf("links of %s left:\n%s", prefix, links)
	}
	mounts, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(mounts), "cnichain-") {
		t.Errorf("mounts left:\n%s", mounts)
	}
}
