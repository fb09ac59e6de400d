package test

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/phasegate/phasegate/network/nft"
	"github.com/phasegate/phasegate/network/ports"
)

// A container's published ports come in the runtime's "portMappings"
// capability args (cnitool's CAP_ARGS) and are DNAT'd in the daemon's own
// table: a connection to 127.0.0.1:<host port> reaches the container and
// holds across a kill -9 and a SIGHUP upgrade of the daemon; another
// container asking for the same host port is refused; DEL leaves no
// element.
func TestCNIPublishedPortsWithCnitool(t *testing.T) {
	h := newHost(t)
	addr := freePort(t)
	args := h.args(addr)
	d := start(t, nil, args...)
	d.waitServing(time.Minute)
	n := newCNINet(t, h.prefix+"pub", d.control, map[string]any{"capabilities": map[string]any{"portMappings": true}})
	_, hp, _ := net.SplitHostPort(freePort(t))
	hostPort, _ := strconv.Atoi(hp)
	capArgs := fmt.Sprintf(`CAP_ARGS={"portMappings":[{"hostPort":%d,"containerPort":%s,"protocol":"tcp"}]}`, hostPort, workloadPort)
	ns := containerNetns(t, "pub")
	res := parseResult(t, n.mustTool("add", ns, capArgs), ns)
	leased := cniLeases(t, d, n.name)
	if len(leased) != 1 || len(leased[0].GetPorts()) != 1 || leased[0].GetPorts()[0].GetHostPort() != uint32(hostPort) {
		t.Fatalf("the attachment's published ports: %v", leased)
	}
	w := startWorkload(t, leased[0].GetIndex(), ns, res.insideAddr())
	published := probeEcho(leased[0].GetIndex(), net.JoinHostPort("127.0.0.1", strconv.Itoa(hostPort)))
	waitFor(t, 10*time.Second, "the container to answer at the published port", func() bool { return published.ok.Load() > 0 })

	other := containerNetns(t, "other")
	if _, perr := n.tool("add", other, capArgs); perr == nil {
		t.Fatal("a second container took a host port another publishes")
	}

	for _, how := range []string{"kill -9", "SIGHUP upgrade"} {
		if how == "kill -9" {
			d.signal(syscall.SIGKILL)
			d.wait(time.Minute)
			d = start(t, nil, args...)
		} else {
			served := strings.Count(d.Output(), "msg=serving ")
			d.signal(syscall.SIGHUP)
			waitFor(t, 2*time.Minute, "the upgraded image to serve", func() bool { return strings.Count(d.Output(), "msg=serving ") > served })
		}
		d.waitServing(time.Minute)
		waitFor(t, time.Minute, "the restored lease's check", func() bool { return n.checkPasses(ns) })
		if l := cniLeases(t, d, n.name); len(l) != 1 || l[0].GetLostReason() != "" || len(l[0].GetPorts()) != 1 {
			t.Fatalf("after %s the attachment is not restored with its ports: %v", how, l)
		}
		before := published.ok.Load()
		waitFor(t, 10*time.Second, "the published port to keep answering after "+how, func() bool { return published.ok.Load() > before+5 })
	}
	ok, failed, last := published.finish()
	if failed != 0 {
		t.Errorf("the connection through the published port broke across the restarts: %d probes failed (last %v), %d answered", failed, last, ok)
	}
	w.finish()
	n.mustTool("del", ns, capArgs)
	for _, m := range []string{ports.MapAny, ports.MapAddr} {
		if out := run(t, "nft", "list", "map", "inet", nft.TableName(h.prefix), m); strings.Contains(out, "elements") {
			t.Errorf("DEL left an element of %s:\n%s", m, out)
		}
	}
}

// podman run -p HOST:CONTAINER on the phasegate network answers on the
// host's port (from the host, at 127.0.0.1), and podman rm -f leaves no
// element of the published ports' maps.
func TestPodmanPublishedPort(t *testing.T) {
	h := newHost(t)
	addr := freePort(t)
	d := start(t, nil, h.args(addr, "--slots=16")...)
	d.waitServing(time.Minute)
	n := newCNINetOf(t, "1.0.0", h.prefix+"pp", d.control, map[string]any{"capabilities": map[string]any{"portMappings": true}})
	hostForwarding(t)
	p := newPodman(t, n.confDir)
	_, hp, _ := net.SplitHostPort(freePort(t))
	name := h.prefix + "pub"
	argv := p.runArgs(n.name, "-d", "--name", name, "-p", hp+":"+workloadPort)
	if out, err := p.cmd(append(argv, "/bin/nc", "-ll", "-p", workloadPort, "-e", "/bin/cat")...).CombinedOutput(); err != nil {
		t.Fatalf("podman run -d -p: %v\n%s", err, out)
	}
	leased := cniLeases(t, d, n.name)
	if len(leased) != 1 || len(leased[0].GetPorts()) != 1 || strconv.Itoa(int(leased[0].GetPorts()[0].GetHostPort())) != hp {
		t.Fatalf("the container's attachment and its published ports: %v", leased)
	}
	w := probeEcho(leased[0].GetIndex(), net.JoinHostPort("127.0.0.1", hp))
	waitFor(t, 10*time.Second, "the container to answer at 127.0.0.1:"+hp, func() bool { return w.ok.Load() > 0 })
	if ok, failed, last := w.finish(); failed != 0 {
		t.Errorf("%d probes of the published port failed (last %v), %d answered", failed, last, ok)
	}
	if out, err := p.cmd("rm", "-f", "-t", "0", name).CombinedOutput(); err != nil {
		t.Fatalf("podman rm -f: %v\n%s", err, out)
	}
	if l := cniLeases(t, d, n.name); len(l) != 0 {
		t.Errorf("podman rm -f left %d attachments", len(l))
	}
	for _, m := range []string{ports.MapAny, ports.MapAddr} {
		if out := run(t, "nft", "list", "map", "inet", nft.TableName(h.prefix), m); strings.Contains(out, "elements") {
			t.Errorf("podman rm -f left an element of %s:\n%s", m, out)
		}
	}
}
