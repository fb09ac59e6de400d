package test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// helpOf runs the binary with args and returns its output and exit code.
func helpOf(t *testing.T, args ...string) (string, int) {
	t.Helper()
	out, err := exec.Command(binary, args...).CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return string(out), 0
	case errors.As(err, &ee):
		return string(out), ee.ExitCode()
	}
	t.Fatalf("phasegate %s: %v", strings.Join(args, " "), err)
	return "", 0
}

// TestHelpOfEveryCommand: every command the usage lists, and every verb
// of slots, answers --help (and "help <command>") with exit 0 and its
// synopsis, flags and verbs. The commands are read from the usage itself,
// so a new command is covered without touching this test.
func TestHelpOfEveryCommand(t *testing.T) {
	usage, code := helpOf(t, "help")
	if code != 0 {
		t.Fatalf("phasegate help exited %d:\n%s", code, usage)
	}
	_, section, _ := strings.Cut(usage, "commands:\n")
	section, _, _ = strings.Cut(section, "\n\n")
	var commands []string
	for _, l := range strings.Split(section, "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			commands = append(commands, f[0])
		}
	}
	if !slices.Contains(commands, "slots") || !slices.Contains(commands, "decommission") {
		t.Fatalf("commands read from the usage: %q\n%s", commands, usage)
	}
	verbs := []string{"acquire", "release", "keepalive", "get", "list"}
	flagLine := regexp.MustCompile(`(?m)^  --[a-z]`)
	type invocation struct {
		args     []string
		synopsis string // the start of the usage line
		flags    bool   // the command has flags, and they must be listed
	}
	var cases []invocation
	for _, c := range commands {
		flags := c != "version"
		cases = append(cases,
			invocation{[]string{c, "--help"}, "usage: phasegate " + c, flags},
			invocation{[]string{"help", c}, "usage: phasegate " + c, flags})
	}
	for _, v := range verbs {
		cases = append(cases, invocation{[]string{"slots", v, "--help"}, "usage: phasegate slots", true})
	}
	for _, tc := range cases {
		out, code := helpOf(t, tc.args...)
		name := strings.Join(tc.args, " ")
		if code != 0 {
			t.Errorf("phasegate %s exited %d, want 0:\n%s", name, code, out)
			continue
		}
		if !strings.HasPrefix(out, tc.synopsis) {
			t.Errorf("phasegate %s does not start with %q:\n%s", name, tc.synopsis, out)
		}
		if tc.flags && !flagLine.MatchString(out) {
			t.Errorf("phasegate %s lists no flags:\n%s", name, out)
		}
		if tc.args[0] == "slots" || tc.args[len(tc.args)-1] == "slots" {
			for _, v := range verbs {
				if !strings.Contains(out, v) {
					t.Errorf("phasegate %s does not list the verb %s:\n%s", name, v, out)
				}
			}
		}
	}
}

// TestDecommissionLeavesTheStateDirectoryAsItSays: after a daemon ran and
// stopped, keeping its warm slots recorded, decommission says it removed the records file, and the
// state directory holds nothing of it afterwards.
func TestDecommissionLeavesTheStateDirectoryAsItSays(t *testing.T) {
	h := newHost(t)
	h.prepareDir()
	d := start(t, nil, h.args(freePort(t))...)
	d.waitServing(time.Minute)
	d.signal(syscall.SIGTERM)
	if code := d.wait(time.Minute); code != 0 {
		t.Fatalf("daemon exited %d:\n%s", code, d.Output())
	}
	state := filepath.Join(h.stateDir, "slots.db")
	if _, err := os.Stat(state); err != nil {
		t.Fatalf("the stopped daemon left no records (%v): the test shows nothing", err)
	}
	out, err := exec.Command(binary, "decommission", "--destroy-leased-slots", "--netns-dir="+h.netnsDir,
		"--slot-prefix="+h.prefix, "--slot-cidr="+h.cidr, "--slots=4000", "--state-dir="+h.stateDir).CombinedOutput()
	if err != nil {
		t.Fatalf("decommission: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "removed "+state) {
		t.Errorf("decommission does not say it removed %s:\n%s", state, out)
	}
	left, err := os.ReadDir(h.stateDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range left {
		t.Errorf("decommission left %s in the state directory; it said:\n%s", e.Name(), out)
	}
	h.assertClean(h.prefix, nil)
}
