package test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
)

// shortLived is what one run of the Nomad incident's pattern saw: errors,
// and how long each `podman run` took, sorted.
type shortLived struct {
	errs []string
	took []time.Duration
}

// networkErrors are the errors that name the network: the plugin's, or
// the CNI setup's. podman 4.3 has its own under load ("getting exit code
// of container … no such exit code"), on either network.
func (s shortLived) networkErrors() []string {
	var out []string
	for _, e := range s.errs {
		// podman says `plugin type="…" failed (add): …` for a plugin's
		// error, and "… network namespace …" for its own setup of it.
		if strings.Contains(e, "plugin type=") || strings.Contains(e, "network namespace") {
			out = append(out, e)
		}
	}
	return out
}

func (s shortLived) String() string {
	if len(s.took) == 0 {
		return fmt.Sprintf("%d errors", len(s.errs))
	}
	return fmt.Sprintf("%d runs, %d errors (%d naming the network), podman run p50 %v p99 %v", len(s.took), len(s.errs), len(s.networkErrors()),
		s.took[len(s.took)/2].Round(time.Millisecond), s.took[len(s.took)*99/100].Round(time.Millisecond))
}

// runShortLived runs n `exit 0` containers on network, parallel at a time.
func runShortLived(p *podman, network string, n, parallel int) shortLived {
	var mu sync.Mutex
	var out shortLived
	var wg sync.WaitGroup
	next := make(chan int)
	for range parallel {
		wg.Go(func() {
			for i := range next {
				start := time.Now()
				o, err := p.run(network, "/bin/true")
				took := time.Since(start)
				mu.Lock()
				out.took = append(out.took, took)
				if err != nil {
					out.errs = append(out.errs, fmt.Sprintf("run %d: %v: %s", i, err, strings.TrimSpace(o)))
				}
				mu.Unlock()
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	slices.Sort(out.took)
	return out
}

// runtimeNetns lists the namespaces runtimes bind under /run/netns
// (podman 4.3 names its "netns-<uuid>", later ones and containerd's CRI
// "cni-<uuid>").
func runtimeNetns() []string {
	var all []string
	for _, glob := range []string{"/run/netns/netns-*", "/run/netns/cni-*"} {
		m, _ := filepath.Glob(glob)
		all = append(all, m...)
	}
	return all
}

// newRuntimeNetns are the runtime namespaces not in before.
func newRuntimeNetns(before []string) []string {
	var out []string
	for _, p := range runtimeNetns() {
		if !slices.Contains(before, p) {
			out = append(out, p)
		}
	}
	return out
}

// removeRuntimeNetns removes, at the end of the test, whatever runtime
// namespace is left that was not there before it: those a runtime leaked
// on its own error are the test's to remove.
func removeRuntimeNetns(t *testing.T, before []string) {
	t.Cleanup(func() {
		for _, p := range newRuntimeNetns(before) {
			_ = syscall.Unmount(p, syscall.MNT_DETACH)
			if err := os.Remove(p); err != nil {
				t.Errorf("remove the runtime namespace %s left: %v", p, err)
			}
		}
	})
}

// The Nomad incident's pattern (hashicorp/nomad#25610): 200 short-lived
// `exit 0` containers, 4 at a time, with podman on a phasegate network.
// Every one succeeds, and nothing is left: no lease, no namespace, no link
// or address beyond the daemon's warm slots. The same run on the reference
// bridge + host-local network is reported beside it.
func TestPodmanShortLivedContainersLeakNothing(t *testing.T) {
	const runs, parallel = 200, 4
	h := newHost(t)
	addr := freePort(t)
	d := start(t, nil, h.args(addr, "--slots=64")...)
	d.waitServing(time.Minute)
	n := newCNINetOf(t, "1.0.0", h.prefix+"pm", d.control, nil)
	ref := h.prefix + "ref"
	ipam := refNet(t, n.confDir, ref, h.prefix+"br", lastSubnet(t, h.cidr))
	hostForwarding(t)
	p := newPodman(t, n.confDir)
	// podman and its plugins run in a namespace of the test's, for both
	// networks alike: the reference bridge and the forwarding it turns on
	// are there, not on the host.
	p.netns = containerNetns(t, "runtime")
	before := runtimeNetns()
	removeRuntimeNetns(t, before)

	pg := runShortLived(p, n.name, runs, parallel)
	t.Logf("phasegate: %s", pg)
	for i, e := range pg.errs[:min(len(pg.errs), 5)] {
		t.Logf("podman error %d of %d: %s", i+1, len(pg.errs), e)
	}
	if mine := pg.networkErrors(); len(mine) > 0 {
		t.Errorf("%d of %d containers failed on the phasegate network, the first: %s", len(mine), runs, mine[0])
	}
	c := d.slots()
	lost := endEveryAttachment(t, d, p, n, pg)
	checkPoolSettled(t, h, c)
	checkRuntimeNetnsLeft(t, before, len(pg.errs), lost)

	rf := runShortLived(p, ref, runs, parallel)
	ports := strings.Count(inNetns(t, p.netns, "ip", "-o", "link", "show", "master", h.prefix+"br"), "\n")
	ips, _ := filepath.Glob(filepath.Join(ipam, ref, "[0-9]*"))
	t.Logf("reference bridge + host-local: %s; left: %d bridge ports, %d addresses allocated, %d runtime namespaces",
		rf, ports, len(ips), len(newRuntimeNetns(before)))
	writeReport(t, "cni-short-lived.txt", fmt.Sprintf("%d `podman run --rm … /bin/true`, %d at a time:\nphasegate: %s, 0 left\nreference bridge + host-local: %s; left %d bridge ports, %d addresses\n",
		runs, parallel, pg, rf, ports, len(ips)))
	d.signal(syscall.SIGTERM)
	if code := d.wait(time.Minute); code != 0 {
		t.Fatalf("exit %d", code)
	}
	h.decommission(h.prefix)
}

// endEveryAttachment waits for every attachment of network n to be one
// of a container podman still has (podman ends a container's network
// after `podman run --rm` returns), GCs the ones whose clean-up podman
// lost, removes the containers podman kept, and checks no attachment is
// left; it returns how many containers' clean-up was lost.
func endEveryAttachment(t *testing.T, d *daemon, p *podman, n *cniNet, pg shortLived) int {
	t.Helper()
	c := d.slots()
	// podman ends a container's network from conmon's exit command, after
	// `podman run --rm` returns: every attachment left is one of a
	// container podman still has, and goes with it.
	settled := poll(time.Minute, func() bool {
		time.Sleep(100 * time.Millisecond)
		return len(cniLeasesOf(t, c, n.name)) <= p.containers()
	})
	// Containers whose clean-up podman lost: each leaves at most its
	// namespace behind (below).
	lost := len(pg.errs)
	if !settled {
		forgotten := podmanForgot(t, d, p, cniLeasesOf(t, c, n.name))
		if len(pg.errs) == 0 && len(forgotten) > 0 {
			t.Fatalf("%d attachments of containers podman no longer has, and no DEL asked for them, with no podman error: %v", len(forgotten), forgotten)
		}
		// podman's own error (above) lost the container before its
		// clean-up asked for a DEL: the incident's class of leak, which
		// is what GC is for. A runtime that calls GC gets this at once.
		// podman 4.3's exit-code race ("getting exit code of container
		// … from DB: no such exit code", the class of containers/podman
		// #14859) can lose the clean-up of a container started beside
		// the one it fails: seen once as 1 error and 2 containers
		// without a DEL. podmanForgot has already failed the test for
		// any DEL that was asked and not done.
		t.Logf("podman removed %d containers without asking for their DEL (%v); GC ends them", len(forgotten), forgotten)
		p.gc(t, n)
		lost = max(lost, len(forgotten))
	}
	if left, kept := len(cniLeases(t, d, n.name)), p.containers(); left > 0 {
		t.Logf("%d attachments of the %d containers podman kept (its own errors above); removing them", left, kept)
		if out, err := p.cmd("rm", "-a", "-f", "-t", "0").CombinedOutput(); err != nil {
			t.Fatalf("podman rm -a: %v\n%s", err, out)
		}
	}
	if l := cniLeases(t, d, n.name); len(l) != 0 {
		t.Errorf("%d attachments left after every container ended", len(l))
	}
	return lost
}

// checkPoolSettled checks the pool settles after the DELs (answered
// before their slots' teardown): the prefix's host links and namespaces
// are the warm slots' alone, and no parked end is left.
func checkPoolSettled(t *testing.T, h *host, c phasegatev1.SlotsClient) {
	t.Helper()
	// The DELs answered before their slots' teardown: the pool settles
	// just after.
	var links, files, warm int
	settledPool := poll(30*time.Second, func() bool {
		warm = 0
		for _, s := range listSlots(t, c, true) {
			if s.GetState() == phasegatev1.SlotState_SLOT_STATE_WARM {
				warm++
			}
		}
		links, files = len(h.links(h.prefix+"h")), len(h.netnsFiles(h.prefix))
		return links == warm && files == warm && len(h.links(h.prefix+"x")) == 0
	})
	if !settledPool {
		t.Errorf("after the runs: %d host links, %d parked ends and %d slot namespaces of the prefix, want the %d warm slots' alone",
			links, len(h.links(h.prefix+"x")), files, warm)
	}
}

// checkRuntimeNetnsLeft checks the runtime namespaces left beside those
// there before: podman binds each container's namespace and removes it
// in its clean-up; one its own error lost stays (the incident's leak,
// which is podman's and not the network's), at most one per loss.
func checkRuntimeNetnsLeft(t *testing.T, before []string, errs, lost int) {
	t.Helper()
	// podman binds each container's namespace and removes it in its
	// clean-up; one its own error lost stays (the incident's leak, which is
	// podman's and not the network's), at most one per error.
	var left []string
	poll(30*time.Second, func() bool { left = newRuntimeNetns(before); return len(left) == 0 })
	if len(left) > lost {
		t.Errorf("%d runtime namespaces left under /run/netns after %d podman errors and %d containers whose clean-up it lost: %v", len(left), errs, lost, left)
	} else if len(left) > 0 {
		t.Logf("podman's own errors left %d of its namespaces (%v); the test removes them", len(left), left)
	}
}

// A long-running container started by podman on the phasegate network
// keeps answering a TCP echo through kill -9, SIGTERM and a start, and a
// SIGHUP upgrade of the daemon; `podman rm -f` ends its attachment.
func TestPodmanContainerKeepsAnsweringAcrossRestarts(t *testing.T) {
	h := newHost(t)
	addr := freePort(t)
	args := h.args(addr, "--slots=64")
	d := start(t, nil, args...)
	d.waitServing(time.Minute)
	n := newCNINetOf(t, "1.0.0", h.prefix+"pl", d.control, nil)
	hostForwarding(t)
	p := newPodman(t, n.confDir)
	name := h.prefix + "echo"
	out, err := p.cmd(append(p.runArgs(n.name, "-d", "--name", name), "/bin/nc", "-ll", "-p", "7777", "-e", "/bin/cat")...).CombinedOutput()
	if err != nil {
		t.Fatalf("podman run -d: %v\n%s", err, out)
	}
	leased := cniLeases(t, d, n.name)
	if len(leased) != 1 {
		t.Fatalf("%d attachments for the container, want 1", len(leased))
	}
	inside, _, _ := strings.Cut(leased[0].GetInsideAddress(), "/")
	w := probeEcho(leased[0].GetIndex(), inside+":7777")
	waitFor(t, 10*time.Second, "the container to answer", func() bool { return w.ok.Load() > 0 })

	for _, how := range []string{"kill -9", "SIGTERM and a start", "SIGHUP upgrade"} {
		switch how {
		case "kill -9":
			d.signal(syscall.SIGKILL)
			d.wait(time.Minute)
			d = start(t, nil, args...)
		case "SIGTERM and a start":
			d.signal(syscall.SIGTERM)
			if code := d.wait(time.Minute); code != 0 {
				t.Fatalf("SIGTERM: exit %d", code)
			}
			d = start(t, nil, args...)
		case "SIGHUP upgrade":
			served := strings.Count(d.Output(), "msg=serving ")
			d.signal(syscall.SIGHUP)
			waitFor(t, 2*time.Minute, "the upgraded image to serve", func() bool { return strings.Count(d.Output(), "msg=serving ") > served })
		}
		d.waitServing(time.Minute)
		before := w.ok.Load()
		waitFor(t, 10*time.Second, "the container to keep answering after "+how, func() bool { return w.ok.Load() > before+5 })
	}
	ok, failed, last := w.finish()
	t.Logf("the container answered %d probes across the restarts, %d failed", ok, failed)
	if failed != 0 {
		t.Errorf("the container lost its network: %d probes failed (last: %v)", failed, last)
	}
	if out, err := p.cmd("rm", "-f", "-t", "0", name).CombinedOutput(); err != nil {
		t.Fatalf("podman rm -f: %v\n%s", err, out)
	}
	if l := cniLeases(t, d, n.name); len(l) != 0 {
		t.Errorf("podman rm -f left %d attachments", len(l))
	}
	d.signal(syscall.SIGTERM)
	if code := d.wait(time.Minute); code != 0 {
		t.Fatalf("exit %d", code)
	}
	h.decommission(h.prefix)
}

// podmanForgot are the request ids of the attachments whose container
// podman no longer has and for which no DEL reached the daemon (its audit
// log names every call): podman lost them. An attachment for which a DEL
// was asked and that stayed is the daemon's failure, and fails the test.
func podmanForgot(t *testing.T, d *daemon, p *podman, leased []*phasegatev1.Slot) []string {
	t.Helper()
	has := map[string]bool{}
	for _, id := range p.containerIDs() {
		has[id] = true
	}
	var forgot []string
	for _, l := range leased {
		ctr, _, _ := strings.Cut(l.GetRequestId(), "/")
		if has[ctr] {
			continue
		}
		asked := slices.ContainsFunc(strings.Split(d.Output(), "\n"), func(line string) bool {
			return strings.Contains(line, "method=CNIDel") && strings.Contains(line, "request_id="+l.GetRequestId()+" ")
		})
		if asked {
			t.Errorf("a DEL was asked for %s and its attachment stayed", l.GetRequestId())
			continue
		}
		forgot = append(forgot, l.GetRequestId())
	}
	return forgot
}
