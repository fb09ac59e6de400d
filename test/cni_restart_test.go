package test

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// An attached container keeps its connectivity through every way the
// daemon restarts — kill -9, SIGTERM and a start, a SIGHUP upgrade — and
// the attachment is still the runtime's afterwards: CHECK passes, a
// repeated ADD answers the same, DEL ends it. An ADD made while the daemon
// is down waits for it and succeeds once it serves; one whose timeout ends
// first fails saying why, and leaves nothing.
func TestCNIAttachmentsSurviveRestarts(t *testing.T) {
	h := newHost(t)
	addr := freePort(t)
	args := h.args(addr, "--slots=64")
	d := start(t, nil, args...)
	d.waitServing(time.Minute)
	n := newCNINet(t, h.prefix+"rs", d.control, nil)
	ns := containerNetns(t, "c1")
	res := parseResult(t, n.mustTool("add", ns), ns)
	leased := cniLeases(t, d, n.name)
	w := startWorkload(t, leased[0].GetIndex(), ns, res.insideAddr())
	waitFor(t, 10*time.Second, "the container to answer", func() bool { return w.ok.Load() > 0 })

	restart := map[string]func(){
		"kill -9": func() {
			d.signal(syscall.SIGKILL)
			d.wait(time.Minute)
			d = start(t, nil, args...)
		},
		"SIGTERM and a start": func() {
			d.signal(syscall.SIGTERM)
			if code := d.wait(time.Minute); code != 0 {
				t.Fatalf("SIGTERM: exit %d", code)
			}
			d = start(t, nil, args...)
		},
		"SIGHUP upgrade": func() {
			before := strings.Count(d.Output(), "msg=serving ")
			d.signal(syscall.SIGHUP)
			waitFor(t, 2*time.Minute, "the upgraded image to serve", func() bool {
				return strings.Count(d.Output(), "msg=serving ") > before
			})
		},
	}
	for _, how := range []string{"kill -9", "SIGTERM and a start", "SIGHUP upgrade"} {
		restart[how]()
		d.waitServing(time.Minute)
		waitFor(t, time.Minute, "the restored lease's check", func() bool { return n.checkPasses(ns) })
		again := parseResult(t, n.mustTool("add", ns), ns)
		if again.IPs[0].Address != res.IPs[0].Address || again.Interfaces[1].Mac != res.Interfaces[1].Mac {
			t.Errorf("after %s a repeated ADD answered another attachment: %+v", how, again)
		}
		before := w.ok.Load()
		waitFor(t, 10*time.Second, "the container to keep answering after "+how, func() bool { return w.ok.Load() > before+5 })
	}

	// An ADD while the daemon is down waits for it.
	d.signal(syscall.SIGKILL)
	d.wait(time.Minute)
	late := containerNetns(t, "late")
	addWaitsForTheDaemon(t, n, late, func() { d = start(t, nil, args...) })
	d.waitServing(time.Minute)

	// One whose timeout ends first fails, saying why.
	d.signal(syscall.SIGKILL)
	d.wait(time.Minute)
	short := newCNINet(t, n.name, d.control, map[string]any{"timeout": "1s"})
	never := containerNetns(t, "never")
	_, perr := short.exec("ADD", short.conf, "CNI_CONTAINERID=never", "CNI_IFNAME=eth0", "CNI_NETNS="+never)
	if perr == nil || perr.Code != 11 || !strings.Contains(perr.Msg, "waited 1") || !strings.Contains(perr.Msg, "nothing listens on "+d.control) {
		t.Fatalf("ADD with the daemon down past the timeout: %+v, want code 11 saying it waited and why", perr)
	}
	if got := inNetns(t, never, "ip", "-o", "link"); strings.Contains(got, "eth0") {
		t.Errorf("the failed ADD left a link: %s", got)
	}
	d = start(t, nil, args...)
	d.waitServing(time.Minute)
	ok, failed, last := w.finish()
	t.Logf("the container answered %d probes across the restarts, %d failed", ok, failed)
	if failed != 0 || ok == 0 {
		t.Errorf("the container lost its network: %d probes failed (last: %v), %d answered", failed, last, ok)
	}
	for _, p := range []string{ns, late} {
		n.mustTool("del", p)
	}
	if l := cniLeases(t, d, n.name); len(l) != 0 {
		t.Errorf("%d attachments left after DEL", len(l))
	}
}

// addWaitsForTheDaemon runs an ADD into late while the daemon is down:
// it must wait (not return within a second), and succeed once
// startDaemon has started the daemon.
func addWaitsForTheDaemon(t *testing.T, n *cniNet, late string, startDaemon func()) {
	t.Helper()
	type outcome struct {
		out string
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		out, err := n.tool("add", late)
		done <- outcome{out, err}
	}()
	time.Sleep(time.Second)
	select {
	case o := <-done:
		t.Fatalf("ADD with the daemon down returned at once: %v %s", o.err, o.out)
	default:
	}
	startDaemon()
	select {
	case o := <-done:
		if o.err != nil {
			t.Fatalf("ADD that waited for the daemon: %v", o.err)
		}
		parseResult(t, o.out, late)
	case <-time.After(time.Minute):
		t.Fatal("the waiting ADD did not return once the daemon served")
	}
}

// checkPasses reports whether CHECK of the attachment in netns passes.
func (n *cniNet) checkPasses(netns string) bool {
	_, err := n.tool("check", netns)
	return err == nil
}

// STATUS is the daemon's health in the runtime's dialect: 50 at once when
// nothing listens; 50 naming the phase while the daemon starts (here with
// 5,000 dead slots to reclaim and 600 warm slots to make before it
// serves); 0 once it serves whole; 51 naming the warning while it serves
// degraded (a host that does not forward). The daemon runs in a node
// namespace of its own, whose forwarding the test sets.
func TestCNIStatusIsTheDaemonsHealth(t *testing.T) {
	nd := newNode(t)
	h := newHost(t)
	h.node = nd
	socket := filepath.Join(h.stateDir, "control.sock")
	n := newCNINet(t, h.prefix+"st", socket, map[string]any{"timeout": "2s"})
	status := func() *pluginError {
		_, perr := n.exec("STATUS", n.conf)
		return perr
	}
	if perr := status(); perr == nil || perr.Code != 50 || !strings.Contains(perr.Msg, "nothing listens") {
		t.Fatalf("STATUS with no daemon: %+v, want 50 saying nothing listens", perr)
	}

	h.leak(h.prefix, 100, 5000)
	// Forwarding on and a default route: the egress check finds nothing
	// to warn about once the dead are reclaimed.
	run(t, "nsenter", "--net="+nd.ns, "--", "sysctl", "-q", "-w", "net.ipv4.ip_forward=1")
	run(t, "nsenter", "--net="+nd.ns, "--", "ip", "route", "add", "default", "dev", "node0")
	addr := "127.0.0.1:5009"
	args := h.args(addr, "--slots=8000", "--pool-size=600", "--pool-min-ready=600")
	d := nd.start(addr, nd.command(baseEnv(), append([]string{binary}, args...)...))
	var seen []*pluginError
	var starting, reclaiming int
	waitFor(t, 2*time.Minute, "STATUS 0", func() bool {
		perr := status()
		switch {
		case perr == nil:
			return true
		case perr.Code == 50 && reclaiming > 0:
			t.Fatalf("STATUS 50 after the daemon served: %+v", perr)
		case perr.Code == 50 && strings.Contains(perr.Msg, "unavailable: starting: phase"):
			starting++
		case perr.Code == 51 && strings.Contains(perr.Msg, "reclaiming 5000 dead slots"):
			// Serving, while the dead are reclaimed in the background.
			reclaiming++
		case perr.Code != 50:
			t.Fatalf("STATUS while the daemon starts: %+v, want 50, then 51 while it reclaims, then 0", perr)
		}
		seen = append(seen, perr)
		return false
	})
	if starting == 0 {
		t.Errorf("no STATUS while the daemon started named its phase: %v", seen)
	}
	t.Logf("%d STATUS calls before 0: %d naming the phase of the start (e.g. %q), %d while the dead were reclaimed",
		len(seen), starting, seen[len(seen)-1].Msg, reclaiming)
	d.signal(syscall.SIGTERM)
	if code := d.wait(time.Minute); code != 0 {
		t.Fatalf("exit %d", code)
	}

	run(t, "nsenter", "--net="+nd.ns, "--", "sysctl", "-q", "-w", "net.ipv4.ip_forward=0")
	d = nd.start(addr, nd.command(baseEnv(), append([]string{binary}, h.args(addr, "--slots=8000")...)...))
	waitFor(t, time.Minute, "the egress check", func() bool { return strings.Contains(d.Output(), "egress check done") })
	perr := status()
	if perr == nil || perr.Code != 51 || !strings.Contains(perr.Msg, "net.ipv4.ip_forward is 0") {
		t.Fatalf("STATUS of a daemon serving with forwarding off: %+v, want 51 naming it", perr)
	}
	d.signal(syscall.SIGTERM)
	if code := d.wait(time.Minute); code != 0 {
		t.Fatalf("exit %d", code)
	}
	h.decommission(h.prefix)
}
