package test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
)

// A lease's usage (issue 46, accounting): what crosses its slot is
// counted each way on Get, List and `phasegate slots get`, and never goes
// back while the lease lives: not across a restart, nor when its host
// link, deleted from outside, is made again. Its release's audit line
// carries the totals. On 65cb2fe a Slot had no usage at all.
func TestLeaseUsageIsCountedAndNeverGoesBack(t *testing.T) {
	h := newHost(t)
	args := h.args(freePort(t), "--slots=8")
	d := start(t, nil, args...)
	d.waitServing(time.Minute)
	c := d.slots()
	l := acquire(t, c, "tenant-acct", "acct", 0)
	inside, _, _ := strings.Cut(l.slot.GetInsideAddress(), "/")
	startWorkload(t, l.slot.GetIndex(), l.slot.GetNetnsPath(), inside).finish()
	addr := net.JoinHostPort(inside, workloadPort)

	// Lines of 1,000 bytes each way: at least that much in and out.
	const lines, size = 200, 1000
	echo(t, addr, lines, size)
	u1 := usageOf(t, c, l)
	if u1.GetBytesIn() < lines*size || u1.GetBytesOut() < lines*size || u1.GetPacketsIn() == 0 || u1.GetPacketsOut() == 0 {
		t.Fatalf("after %d lines of %d bytes echoed: usage %v", lines, size, u1)
	}
	cliUsage(t, h, l, u1)
	// /metrics: bounded labels (a direction), the traffic the daemon read.
	fams := scrapeMetrics(t, d)
	for _, dir := range []string{"in", "out"} {
		if v := metricValue(fams, "phasegate_lease_traffic_bytes_total", "direction", dir); v < lines*size {
			t.Errorf("phasegate_lease_traffic_bytes_total{direction=%q} = %v after %d lines of %d bytes", dir, v, lines, size)
		}
	}

	// A restart: the same totals (nothing crossed meanwhile but what the
	// daemon itself sends, which is nothing).
	d.signal(syscall.SIGTERM)
	if code := d.wait(time.Minute); code != 0 {
		t.Fatalf("exit %d", code)
	}
	d = start(t, nil, args...)
	d.waitServing(time.Minute)
	c = d.slots()
	u2 := usageOf(t, c, l)
	notBelow(t, "after a restart", u2, u1)

	// The host link deleted from outside and made again by the daemon:
	// what the old link counted is carried.
	run(t, "ip", "link", "del", l.slot.GetHostInterface())
	waitFor(t, 25*time.Second, "the host link made again", func() bool {
		return strings.Contains(strings.Join(getSlot(t, c, l.slot.GetIndex()).GetRepaired(), ","), "host link")
	})
	u3 := usageOf(t, c, l)
	notBelow(t, "after the host link was made again", u3, u2)
	waitFor(t, 10*time.Second, "the workload to answer over the new link", func() bool { return dials(addr) })
	echo(t, addr, lines, size)
	u4 := usageOf(t, c, l)
	if u4.GetBytesIn() < u3.GetBytesIn()+lines*size {
		t.Errorf("the new link's traffic is not added: %v, then %v", u3, u4)
	}
	listed := listedUsage(t, c, l)
	notBelow(t, "List", listed, u4)

	releaseSaysUsage(t, d, c, l, u4)
	d.signal(syscall.SIGTERM)
	if code := d.wait(time.Minute); code != 0 {
		t.Fatalf("exit %d", code)
	}
	h.decommission(h.prefix)
	h.assertClean(h.prefix, nil)
}

// releaseSaysUsage releases lease l and checks its audit line carries
// its totals, at least u.
func releaseSaysUsage(t *testing.T, d *daemon, c phasegatev1.SlotsClient, l held, u *phasegatev1.Usage) {
	t.Helper()
	if _, err := c.Release(context.Background(), &phasegatev1.ReleaseRequest{Index: l.slot.GetIndex(), LeaseId: l.leaseID}); err != nil {
		t.Fatal(err)
	}
	var line string
	// The daemon's output reaches the test through a pipe: the line may
	// follow the reply by a moment.
	waitFor(t, 10*time.Second, "the release's audit line", func() bool {
		line = grepLines(d.Output(), "method=Release")
		return line != ""
	})
	t.Logf("the release's audit line: %s", line)
	for _, kv := range []string{"audit=true", fmt.Sprintf("slot=%d", l.slot.GetIndex())} {
		if !strings.Contains(line, kv) {
			t.Errorf("the release's audit line lacks %q:\n%s", kv, line)
		}
	}
	var in uint64
	if _, err := fmt.Sscan(after(line, "bytes_in="), &in); err != nil || in < u.GetBytesIn() {
		t.Errorf("the release's audit line says bytes_in=%d (%v), Get said %d before:\n%s", in, err, u.GetBytesIn(), line)
	}
}

// echo sends n lines of size bytes to the line echo at addr and reads
// each back.
func echo(t *testing.T, addr string, n, size int) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Minute))
	r := bufio.NewReader(c)
	line := strings.Repeat("x", size-1) + "\n"
	for range n {
		if _, err := c.Write([]byte(line)); err != nil {
			t.Fatal(err)
		}
		if got, err := r.ReadString('\n'); err != nil || got != line {
			t.Fatalf("echo: %d bytes, %v", len(got), err)
		}
	}
}

// dials reports whether something answers a TCP connect at addr.
func dials(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err == nil {
		c.Close()
	}
	return err == nil
}

// usageOf is Get's usage of lease l's slot.
func usageOf(t *testing.T, c phasegatev1.SlotsClient, l held) *phasegatev1.Usage {
	t.Helper()
	u := getSlot(t, c, l.slot.GetIndex()).GetUsage()
	if u == nil {
		t.Fatalf("Get of slot %d has no usage", l.slot.GetIndex())
	}
	return u
}

// listedUsage is List's usage of lease l's slot.
func listedUsage(t *testing.T, c phasegatev1.SlotsClient, l held) *phasegatev1.Usage {
	t.Helper()
	resp, err := c.List(context.Background(), &phasegatev1.ListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range resp.GetSlots() {
		if s.GetIndex() == l.slot.GetIndex() && s.GetUsage() != nil {
			return s.GetUsage()
		}
	}
	t.Fatalf("List has no usage for slot %d", l.slot.GetIndex())
	return nil
}

// cliUsage checks `phasegate slots get` shows at least u, as the README's
// command prints it.
func cliUsage(t *testing.T, h *host, l held, u *phasegatev1.Usage) {
	t.Helper()
	out, code := cli(t, "slots", "get", fmt.Sprint(l.slot.GetIndex()), "--state-dir="+h.stateDir)
	var resp phasegatev1.GetResponse
	if code != 0 || protojson.Unmarshal([]byte(out), &resp) != nil {
		t.Fatalf("phasegate slots get: exit %d:\n%s", code, out)
	}
	notBelow(t, "phasegate slots get", resp.GetSlot().GetUsage(), u)
}

// notBelow fails unless every count of got is at least want's.
func notBelow(t *testing.T, when string, got, want *phasegatev1.Usage) {
	t.Helper()
	if got.GetBytesIn() < want.GetBytesIn() || got.GetPacketsIn() < want.GetPacketsIn() || got.GetBytesOut() < want.GetBytesOut() ||
		got.GetPacketsOut() < want.GetPacketsOut() || got.GetDroppedPackets() < want.GetDroppedPackets() {
		t.Errorf("%s the usage went back: %v, was %v", when, got, want)
	}
}

// after is what follows the first prefix in s ("" if none).
func after(s, prefix string) string {
	_, v, _ := strings.Cut(s, prefix)
	return v
}
