package test

import (
	"context"
	"encoding/json"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
	"github.com/phasegate/phasegate/network/nft"
	"github.com/phasegate/phasegate/network/ports"
)

// leaseOut is the part of the slots command's JSON these tests read.
type leaseOut struct {
	Slot struct {
		Index         int    `json:"index"`
		NetnsPath     string `json:"netns_path"`
		InsideAddress string `json:"inside_address"`
		Ports         []struct {
			HostPort uint32 `json:"host_port"`
			Protocol string `json:"protocol"`
		} `json:"ports"`
	} `json:"slot"`
	LeaseID string `json:"lease_id"`
}

// The Slots API's published ports from the command line: acquire
// --publish answers at 127.0.0.1:<host port>; another lease asking for the
// same port, and a port bound on the host, are refused; slots ports
// replaces them; release leaves no element.
func TestSlotsPublishFromTheCommandLine(t *testing.T) {
	h := newHost(t)
	addr := freePort(t)
	d := start(t, nil, h.args(addr, "--slots=8")...)
	d.waitServing(time.Minute)
	sock := "--socket=" + d.control
	_, hp, _ := net.SplitHostPort(freePort(t))
	out, code := cli(t, "slots", "acquire", "web", sock, "--publish", hp+":"+workloadPort)
	var l leaseOut
	if code != 0 || json.Unmarshal([]byte(out), &l) != nil || len(l.Slot.Ports) != 1 || strconv.Itoa(int(l.Slot.Ports[0].HostPort)) != hp {
		t.Fatalf("slots acquire --publish: exit %d\n%s", code, out)
	}
	inside, _, _ := strings.Cut(l.Slot.InsideAddress, "/")
	w := startWorkload(t, uint32(l.Slot.Index), l.Slot.NetnsPath, inside)
	w.finish()
	published := probeEcho(uint32(l.Slot.Index), net.JoinHostPort("127.0.0.1", hp))
	waitFor(t, 10*time.Second, "the slot to answer at 127.0.0.1:"+hp, func() bool { return published.ok.Load() > 0 })
	if ok, failed, last := published.finish(); failed != 0 {
		t.Errorf("%d probes of the published port failed (last %v), %d answered", failed, last, ok)
	}

	if out, code := cli(t, "slots", "acquire", "other", sock, "--publish", hp+":80"); code == 0 || !strings.Contains(out, "AlreadyExists") {
		t.Errorf("another lease took host port %s: exit %d\n%s", hp, code, out)
	}
	bound, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer bound.Close()
	idx := strconv.Itoa(l.Slot.Index)
	if out, code := cli(t, "slots", "ports", idx, l.LeaseID, sock, "--publish", bound.Addr().String()+":80"); code == 0 || !strings.Contains(out, "FailedPrecondition") {
		t.Errorf("a port bound on the host was published: exit %d\n%s", code, out)
	}
	_, hp2, _ := net.SplitHostPort(freePort(t))
	if out, code := cli(t, "slots", "ports", idx, l.LeaseID, sock, "--publish", hp2+":80/udp"); code != 0 || !strings.Contains(out, `"udp"`) {
		t.Fatalf("slots ports: exit %d\n%s", code, out)
	}
	if out, code := cli(t, "slots", "release", idx, l.LeaseID, sock); code != 0 {
		t.Fatalf("slots release: exit %d\n%s", code, out)
	}
	for _, m := range []string{ports.MapAny, ports.MapAddr} {
		if out := run(t, "nft", "list", "map", "inet", nft.TableName(h.prefix), m); strings.Contains(out, "elements") {
			t.Errorf("release left an element of %s:\n%s", m, out)
		}
	}
}

// A leased slot whose host link is deleted from outside is made again by
// the reconcile pass, and its published port answers at 127.0.0.1 again:
// the new link routes 127/8 as the old one did.
func TestPublishedPortAfterItsHostLinkIsMadeAgain(t *testing.T) {
	h := newHost(t)
	d := start(t, nil, h.args(freePort(t), "--slots=8")...)
	d.waitServing(time.Minute)
	_, hp, _ := net.SplitHostPort(freePort(t))
	port, _ := strconv.Atoi(hp)
	slotPort, _ := strconv.Atoi(workloadPort)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := d.slots()
	a, err := c.Acquire(ctx, &phasegatev1.AcquireRequest{Owner: "relinked",
		Ports: []*phasegatev1.PublishedPort{{HostPort: uint32(port), SlotPort: uint32(slotPort)}}})
	if err != nil {
		t.Fatal(err)
	}
	sl := a.GetSlot()
	inside, _, _ := strings.Cut(sl.GetInsideAddress(), "/")
	startWorkload(t, sl.GetIndex(), sl.GetNetnsPath(), inside).finish()
	at := net.JoinHostPort("127.0.0.1", hp)
	published := probeEcho(sl.GetIndex(), at)
	defer func() { published.finish() }()
	waitFor(t, 10*time.Second, "the slot to answer at "+at, func() bool { return published.ok.Load() > 0 })

	run(t, "ip", "link", "del", sl.GetHostInterface())
	waitFor(t, 30*time.Second, "the host link made again", func() bool {
		g, err := c.Get(ctx, &phasegatev1.GetRequest{Index: sl.GetIndex()})
		return err == nil && strings.Contains(strings.Join(g.GetSlot().GetRepaired(), ","), "host link")
	})
	before := published.ok.Load()
	waitFor(t, 10*time.Second, "the slot to answer at "+at+" over its new host link", func() bool { return published.ok.Load() > before+3 })
}
