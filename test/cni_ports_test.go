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
// holds across a kill -9 of the daemon; another container asking for the
// same host port is refused; DEL leaves no element.
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

	d.signal(syscall.SIGKILL)
	d.wait(time.Minute)
	d = start(t, nil, args...)
	d.waitServing(time.Minute)
	before := published.ok.Load()
	waitFor(t, 10*time.Second, "the published port to keep answering after kill -9", func() bool { return published.ok.Load() > before+5 })
	ok, failed, last := published.finish()
	if failed != 0 {
		t.Errorf("the connection through the published port broke across the restart: %d probes failed (last %v), %d answered", failed, last, ok)
	}
	w.finish()
	n.mustTool("del", ns, capArgs)
	for _, m := range []string{ports.MapAny, ports.MapAddr} {
		if out := run(t, "nft", "list", "map", "inet", nft.TableName(h.prefix), m); strings.Contains(out, "elements") {
			t.Errorf("DEL left an element of %s:\n%s", m, out)
		}
	}
}
