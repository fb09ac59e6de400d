package test

// The deployment files are tested by running them. Each test reads its
// file, fills the platform's placeholders from a node it makes (a network
// namespace with an address of its own, see node), writes the TLS files the
// file names, starts the daemon with exactly the file's command line and
// environment, probes it until it serves the way the file's own checks
// would, then stops it with the file's signal and requires an orderly exit
// within the file's stop timeout. The arithmetic between the files'
// timeouts and the daemon's own budgets is checked against `phasegate
// serve <the file's arguments> --check`, the daemon's verdict.
//
// What the tests change, and nothing else:
//   - confine's four flags, appended to the file's (netns directory, slot
//     prefix, state directory, slot network: the host's own slots are not
//     the test's to touch);
//   - the binary's path (/usr/local/bin/phasegate, or the image's
//     entrypoint) is the binary under test;
//   - Kubernetes' Secret mount path, a fixed path in the container, is a
//     temporary directory: kubeRewrite replaces the mount path in the
//     arguments. Nomad's files need no rewrite: their paths are built from
//     NOMAD_SECRETS_DIR, a placeholder the test fills.

import (
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// productionBinary is where the files install the daemon.
const productionBinary = "/usr/local/bin/phasegate"

// serveTimeout bounds how long a test waits for the daemon (built with
// -race, on a shared 2-core machine) to pass its checks.
const serveTimeout = 2 * time.Minute

// runBinary runs the binary under test and returns what it printed.
func runBinary(args ...string) (string, error) {
	out, err := exec.Command(binary, args...).CombinedOutput()
	return string(out), err
}

// waitPass polls f until it returns nil, and fails naming its last error.
func waitPass(t *testing.T, timeout time.Duration, what string, f func() error) {
	t.Helper()
	var last error
	deadline := time.Now().Add(timeout)
	for {
		if last = f(); last == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s; last: %v", timeout, what, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// signalNamed parses a signal name as the files write it ("SIGTERM").
func signalNamed(t *testing.T, name string) syscall.Signal {
	t.Helper()
	s := unix.SignalNum(strings.ToUpper(name))
	if s == 0 {
		t.Fatalf("unknown signal %q", name)
	}
	return s
}
