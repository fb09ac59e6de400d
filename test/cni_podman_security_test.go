package test

import (
	"path/filepath"
	"testing"
	"time"
)

// also writes n's conflist into dir too, for a runtime that reads one
// directory of networks.
func (n *cniNet) also(dir string) {
	n.t.Helper()
	matches, err := filepath.Glob(filepath.Join(n.confDir, "*.conflist"))
	if err != nil || len(matches) != 1 {
		n.t.Fatalf("the conflist of %s: %v %v", n.name, matches, err)
	}
	copyFile(n.t, matches[0], filepath.Join(dir, filepath.Base(matches[0])), 0o644)
}

// A container podman runs with `--cap-add NET_ADMIN --cap-add NET_RAW`
// on a phasegate network: root there may change its namespace at will,
// and reaches nothing the host-side rules forbid. It cannot reach another
// slot, nor the host, nor spoof another slot's address (its own address
// reaches the outside, so a drop is not a broken path); a container whose
// conflist gives an egress policy cannot reach the outside whatever it
// changes inside. The victim, a daemon-owned slot, is untouched and
// answers. The daemon runs in a node namespace with an outside network
// behind it; podman's containers are the host's.
func TestPodmanContainerWithNetAdminReachesNothingItMayNot(t *testing.T) {
	nd := newNode(t)
	newOutside(t, nd) // the outside network, behind the node's default route
	h, d, slots := slotsInNode(t, nd, nil, []string{"victim"}, nil)
	b := slots["victim"]
	victimAt := addrOf(t, b.GetInsideAddress(), 7200)
	victim := listenIn(t, b.GetNetnsPath(), victimAt)
	before := observeVictimIn(t, nd, d.slots(), b.GetIndex())
	open := newCNINetOf(t, "1.0.0", h.prefix+"open", d.control, nil)
	closed := newCNINetOf(t, "1.0.0", h.prefix+"closed", d.control, map[string]any{"egress": map[string]any{}})
	closed.also(open.confDir)
	p := newPodman(t, open.confDir)
	start := func(name, network string) {
		t.Helper()
		args := p.runArgs(network, "-d", "--name", name, "--cap-add", "NET_ADMIN", "--cap-add", "NET_RAW")
		if out, err := p.cmd(append(args, "/bin/sleep", "3600")...).CombinedOutput(); err != nil {
			t.Fatalf("podman run %s: %v\n%s", name, err, out)
		}
	}
	attacker, policied := h.prefix+"attacker", h.prefix+"policied"
	start(attacker, open.name)
	start(policied, closed.name)
	in := func(name string, argv ...string) error {
		return p.cmd(append([]string{"exec", name}, argv...)...).Run()
	}
	outside := outsideUplink.Addr().String()
	if err := in(attacker, "ping", "-c", "2", "-W", "2", outside); err != nil {
		t.Fatalf("the attacker's own ping never reached the outside: the test cannot tell a drop from a broken path: %v", err)
	}

	victimAddr := victimAt.Addr().String()
	across0, host0, spoofed0 := counter(t, nd, h.prefix, "slot-to-slot"), counter(t, nd, h.prefix, "to-host"), counter(t, nd, h.prefix, "spoofed")
	if err := in(attacker, "ping", "-c", "2", "-W", "1", victimAddr); err == nil {
		t.Error("the container reached another slot")
	}
	if err := in(attacker, "nc", "-w", "1", nd.ip.String(), "22"); err == nil {
		t.Error("the container reached the host")
	}
	// Root with NET_ADMIN takes the victim's address as its own.
	if err := in(attacker, "ip", "addr", "add", victimAddr+"/32", "dev", "eth0"); err != nil {
		t.Fatalf("NET_ADMIN in the container could not add an address: %v", err)
	}
	if err := in(attacker, "ping", "-c", "2", "-W", "1", "-I", victimAddr, outside); err == nil {
		t.Error("a ping with the victim's address reached the outside and came back")
	}
	waitFor(t, 10*time.Second, "the drops counted", func() bool {
		return counter(t, nd, h.prefix, "slot-to-slot") > across0 && counter(t, nd, h.prefix, "to-host") > host0 &&
			counter(t, nd, h.prefix, "spoofed") > spoofed0
	})

	// The policied container changes what it can: its routes, its
	// addresses. The outside stays out of reach.
	_ = in(policied, "ip", "route", "replace", "default", "dev", "eth0")
	if err := in(policied, "ping", "-c", "2", "-W", "1", outside); err == nil {
		t.Error("a container with an egress policy reached the outside")
	}

	if got := victim.received(); len(got) > 0 {
		t.Errorf("the victim received %d datagrams", len(got))
	}
	before.same(t, observeVictimIn(t, nd, d.slots(), b.GetIndex()), "the container's attacks")
	if !answers(t, nd, victimAt) {
		t.Error("the victim's workload no longer answers")
	}
	if out, err := p.cmd("rm", "-f", "-t", "0", attacker, policied).CombinedOutput(); err != nil {
		t.Fatalf("podman rm: %v\n%s", err, out)
	}
	if l := cniLeases(t, d, open.name); len(l) != 0 {
		t.Errorf("podman rm left %d attachments", len(l))
	}
}
