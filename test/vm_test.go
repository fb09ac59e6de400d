package test

import (
	"context"
	"net"
	"net/netip"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/phasegate/phasegate/test/internal/microvm"
)

// The guest device every VM test uses, as the slot profile gives it: the
// same address in every slot, behind a tap whose address is its gateway.
var (
	guestAddr    = netip.MustParsePrefix("169.254.0.21/30")
	guestGateway = netip.MustParseAddr("169.254.0.22")
	guestMAC     = net.HardwareAddr{0x52, 0x54, 0x00, 0x00, 0x00, 0x15}
)

const (
	guestPort = 7000            // the guest's echo server
	bootWait  = 2 * time.Minute // a loaded 2-core machine boots it in ~11 s
)

// locateGuest is the built guest, or the test's failure saying why this
// machine cannot run it: never a skip.
func locateGuest(t *testing.T) microvm.Guest {
	t.Helper()
	g, err := microvm.Locate(t.Context(), "..")
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// bootGuest starts a VM with cfg (its console in the test's temporary
// directory when cfg has none) and stops it in the test's clean-up, before
// anything registered earlier (its namespace) is removed.
func bootGuest(t *testing.T, g microvm.Guest, cfg microvm.Config) *microvm.VM {
	t.Helper()
	if cfg.Console == "" {
		cfg.Console = filepath.Join(t.TempDir(), "console.log")
	}
	vm, err := microvm.Start(context.Background(), g, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = vm.Stop(5 * time.Second)
		if t.Failed() {
			text, _ := vm.Console()
			t.Logf("guest console %s:\n%s", cfg.Console, text)
		}
	})
	return vm
}

// TestVMHarness proves the harness on a namespace and tap of the test's own:
// the guest boots, reports ready on its console, its echo server answers
// from inside the namespace, its outbound probes report what they reach,
// and it stops on SIGTERM.
func TestVMHarness(t *testing.T) {
	g := locateGuest(t)
	n := newNode(t)
	for _, cmd := range [][]string{
		{"ip", "tuntap", "add", "dev", "tap0", "mode", "tap"},
		{"ip", "addr", "add", netip.PrefixFrom(guestGateway, guestAddr.Bits()).String(), "dev", "tap0"},
		{"ip", "link", "set", "tap0", "up"},
	} {
		run(t, "nsenter", append([]string{"--net=" + n.ns, "--"}, cmd...)...)
	}
	// An echo server on the tap's side that the guest probes, and a port
	// nothing listens on.
	open := netip.AddrPortFrom(guestGateway, 7001)
	closed := netip.AddrPortFrom(guestGateway, 7002)
	l := n.listen(open.String(), 16)
	ln, err := net.FileListener(l)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go serveEcho(ln)

	vm := bootGuest(t, g, microvm.Config{
		Netns: n.ns, Tap: "tap0", MAC: guestMAC, Addr: guestAddr, Gateway: guestGateway,
		Port: guestPort, Probes: []netip.AddrPort{open, closed},
	})
	ctx, cancel := context.WithTimeout(t.Context(), bootWait)
	defer cancel()
	start := time.Now()
	if _, _, err := vm.WaitConsole(ctx, 0, regexp.MustCompile(`^guest ready `)); err != nil {
		t.Fatal(err)
	}
	at := netip.AddrPortFrom(guestAddr.Addr(), guestPort)
	if err := vm.WaitReady(ctx, n.ns, at); err != nil {
		t.Fatal(err)
	}
	t.Logf("guest answered at %s %v after start", at, time.Since(start).Round(time.Millisecond))
	waitProbe(t, ctx, vm, open, "ok")
	waitProbe(t, ctx, vm, closed, "fail")

	if err := vm.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if exited, _ := vm.Exited(); !exited {
		t.Fatal("qemu still running after Stop")
	}
	if err := microvm.Echo(t.Context(), n.ns, at); err == nil {
		t.Fatalf("the guest at %s still answers after Stop", at)
	}
}

// waitProbe waits for the guest's console to report a check of addr with
// result ("ok" or "fail").
func waitProbe(t *testing.T, ctx context.Context, vm *microvm.VM, addr netip.AddrPort, result string) {
	t.Helper()
	re := regexp.MustCompile(`^probe \d+ ` + regexp.QuoteMeta(addr.String()) + ` ` + result + `$`)
	if _, _, err := vm.WaitConsole(ctx, 0, re); err != nil {
		t.Fatal(err)
	}
}

// serveEcho echoes every connection ln accepts until ln is closed.
func serveEcho(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			buf := make([]byte, 4096)
			for {
				k, err := c.Read(buf)
				if k > 0 {
					if _, werr := c.Write(buf[:k]); werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
	}
}
