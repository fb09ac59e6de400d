package test

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/phasegate/phasegate/test/internal/microvm"
)

// farEnd is a namespace of the test's own that plays an address beyond the
// node: joined to the node by a veth (node side .1 of a /30, far side .2),
// with an echo server the guest probes and a hold server that keeps the
// guest's one long connection and counts its connections and ticks.
type farEnd struct {
	*node
	addr  netip.Addr     // the far side's address
	echo  netip.AddrPort // its echo server
	hold  netip.AddrPort // its hold server
	mu    sync.Mutex
	conns int // connections the hold server accepted
	ticks int // "tick" lines read on them
}

const (
	farEchoPort = 7001
	farHoldPort = 7002
)

// newFarEnd joins a new namespace to n through a veth named link (on n's
// side) with subnet (a /30), routes nothing else, and starts its servers.
// On n, a blackhole route of metric 4000 for wide (which holds subnet)
// keeps packets for it from following any other route if the veth is gone.
func newFarEnd(t *testing.T, n *node, link string, subnet, wide netip.Prefix) *farEnd {
	t.Helper()
	if subnet.Bits() != 30 || !wide.Contains(subnet.Addr()) {
		t.Fatalf("far end %s in %s: want a /30 inside the wide range", subnet, wide)
	}
	near := subnet.Addr().Next()
	f := &farEnd{node: newNode(t), addr: near.Next()}
	f.echo = netip.AddrPortFrom(f.addr, farEchoPort)
	f.hold = netip.AddrPortFrom(f.addr, farHoldPort)
	inNode := func(ns string, args ...string) { run(t, "nsenter", append([]string{"--net=" + ns, "--"}, args...)...) }
	inNode(n.ns, "ip", "link", "add", link, "type", "veth", "peer", "name", "far0", "netns", f.ns)
	inNode(n.ns, "ip", "addr", "add", netip.PrefixFrom(near, 30).String(), "dev", link)
	inNode(n.ns, "ip", "link", "set", link, "up")
	inNode(n.ns, "ip", "route", "add", "blackhole", wide.String(), "metric", "4000")
	inNode(f.ns, "ip", "addr", "add", netip.PrefixFrom(f.addr, 30).String(), "dev", "far0")
	inNode(f.ns, "ip", "link", "set", "far0", "up")
	inNode(f.ns, "ip", "route", "add", "default", "via", near.String())

	echo := fileListener(t, f.listen(f.echo.String(), 64))
	go serveEcho(echo)
	hold := fileListener(t, f.listen(f.hold.String(), 16))
	go f.serveHold(hold)
	return f
}

// fileListener is a net.Listener of the listening socket f, closed in t's
// clean-up (f itself is closed by the listen that made it).
func fileListener(t *testing.T, f *os.File) net.Listener {
	t.Helper()
	ln, err := net.FileListener(f)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// serveHold accepts the guest's long connections and counts them and the
// tick lines they carry, until ln is closed.
func (f *farEnd) serveHold(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		f.mu.Lock()
		f.conns++
		f.mu.Unlock()
		go func() {
			defer c.Close()
			sc := bufio.NewScanner(c)
			for sc.Scan() {
				if strings.HasPrefix(sc.Text(), "tick ") {
					f.mu.Lock()
					f.ticks++
					f.mu.Unlock()
				}
			}
		}()
	}
}

// held is how many connections the hold server has accepted and how many
// ticks came on them.
func (f *farEnd) held() (conns, ticks int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.conns, f.ticks
}

// steadyProbe is a TCP connection into the guest's echo server, from inside
// a namespace, checked with one echo every interval until stopped: what a
// client of a sandbox sees while the daemon restarts.
type steadyProbe struct {
	conn   net.Conn
	stop   chan struct{}
	done   chan struct{}
	mu     sync.Mutex
	echoes int
	fails  []string // each failed echo, with when
}

// startSteadyProbe connects from ns to addr and starts checking it.
func startSteadyProbe(t *testing.T, ns string, addr netip.AddrPort, interval time.Duration) *steadyProbe {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	c, err := microvm.Dial(ctx, ns, addr)
	if err != nil {
		t.Fatalf("connect into the guest at %s: %v", addr, err)
	}
	p := &steadyProbe{conn: c, stop: make(chan struct{}), done: make(chan struct{})}
	go p.run(interval)
	t.Cleanup(func() { p.end() })
	return p
}

func (p *steadyProbe) run(interval time.Duration) {
	defer close(p.done)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-tick.C:
		}
		err := microvm.EchoOn(p.conn, 5*time.Second)
		p.mu.Lock()
		if err != nil {
			p.fails = append(p.fails, fmt.Sprintf("%s: %v", time.Now().Format("15:04:05.000"), err))
		} else {
			p.echoes++
		}
		p.mu.Unlock()
		if err != nil {
			return // the connection is no good any more: one failure says it
		}
	}
}

// end stops the probe and closes its connection; safe to call twice.
func (p *steadyProbe) end() {
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	<-p.done
	p.conn.Close()
}

// result is how many echoes came back and every failure so far.
func (p *steadyProbe) result() (int, []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.echoes, append([]string(nil), p.fails...)
}

// nodeDaemon is the daemon of h run inside n (h.node), with its control
// socket under h's state directory.
func nodeDaemon(t *testing.T, n *node, h *host, addr string, extra ...string) *daemon {
	t.Helper()
	d := n.start(addr, n.command(baseEnv(), append([]string{binary}, h.args(addr, extra...)...)...))
	d.control = filepath.Join(h.stateDir, "control.sock")
	return d
}

// waitNodeServing waits until the daemon in n answers /readyz with 200.
func waitNodeServing(t *testing.T, n *node, addr string, timeout time.Duration) {
	t.Helper()
	waitFor(t, timeout, "the daemon in the node to serve", func() bool {
		code, err := n.httpGet("http://"+addr+"/readyz", nil, 2*time.Second)
		return err == nil && code == http.StatusOK
	})
}

// The far ends' wide ranges, A and B: documentation networks (RFC 5737),
// which no network routes; each far end takes a random /30 of one.
var (
	rangeA = netip.MustParsePrefix("198.51.100.0/24")
	rangeB = netip.MustParsePrefix("203.0.113.0/24")
)

// randomSlash30 is a random /30 of wide.
func randomSlash30(wide netip.Prefix) netip.Prefix {
	a := wide.Addr().As4()
	a[3] = byte(rand.IntN(64) * 4)
	return netip.PrefixFrom(netip.AddrFrom4(a), 30)
}

// consoleLen is how much the guest has written to its console so far.
func consoleLen(t *testing.T, vm *microvm.VM) int {
	t.Helper()
	text, err := vm.Console()
	if err != nil {
		t.Fatal(err)
	}
	return len(text)
}

// slowRounds is how many rounds in a row may miss an address the guest
// should reach before waitRound fails.
const slowRounds = 3

var probeLine = regexp.MustCompile(`^probe (\d+) (\S+) (ok|fail)$`)

// waitRound waits for the first round of the guest's checks that began
// after console offset from and has reported every address of want, and
// fails unless each result is the wanted one. A round that may already
// have been running at from is skipped: it may have checked some
// addresses before a change and some after. An address reached that
// should not be is a failure at once; one not reached that should be may
// be a check that timed out on a loaded machine (the guest runs without
// hardware acceleration), so up to slowRounds such rounds in a row are
// logged and the next one is looked at.
func waitRound(t *testing.T, ctx context.Context, vm *microvm.VM, from int, want map[netip.AddrPort]string) {
	t.Helper()
	text, err := vm.Console()
	if err != nil {
		t.Fatal(err)
	}
	first := 0
	for _, l := range strings.Split(text[:from], "\n") {
		if m := probeLine.FindStringSubmatch(strings.TrimSpace(l)); m != nil {
			r, _ := strconv.Atoi(m[1])
			// Round r+1 may have begun before from without a line yet
			// (a check is under way); r+2 begins after r+1's last line.
			first = max(first, r+2)
		}
	}
	got := map[int]map[string]string{}
	off, slow := from, 0
	for {
		line, next, err := vm.WaitConsole(ctx, off, probeLine)
		if err != nil {
			t.Fatalf("waiting for a round of checks %v: %v", want, err)
		}
		off = next
		m := probeLine.FindStringSubmatch(line)
		r, _ := strconv.Atoi(m[1])
		if r < first {
			continue
		}
		if got[r] == nil {
			got[r] = map[string]string{}
		}
		got[r][m[2]] = m[3]
		if len(got[r]) < len(want) {
			continue
		}
		var reached, missed []string
		for a, res := range want {
			switch g := got[r][a.String()]; {
			case g == res:
			case g == "ok":
				reached = append(reached, a.String())
			default:
				missed = append(missed, a.String())
			}
		}
		if len(reached) > 0 {
			t.Fatalf("round %d of the guest's checks %v: reached %v, which it must not", r, got[r], reached)
		}
		if len(missed) > 0 {
			if slow++; slow > slowRounds {
				t.Fatalf("round %d of the guest's checks %v: %v not reached, %d rounds running", r, got[r], missed, slow)
			}
			t.Logf("round %d of the guest's checks %v: %v not reached; looking at the next round", r, got[r], missed)
			continue
		}
		t.Logf("round %d of the guest's checks: %v", r, got[r])
		return
	}
}

// checkHeld checks that the guest's long connection to f is still the
// first and only one, and still carries ticks.
func checkHeld(t *testing.T, f *farEnd, vm *microvm.VM) {
	t.Helper()
	_, before := f.held()
	waitFor(t, 30*time.Second, "ticks on the guest's long connection", func() bool {
		_, ticks := f.held()
		return ticks >= before+2
	})
	text, _ := vm.Console()
	if conns, _ := f.held(); conns != 1 || strings.Contains(text, "hold broken") {
		t.Fatalf("the guest's long connection was redialled: %d connections, broken on the console: %v",
			conns, strings.Contains(text, "hold broken"))
	}
}
