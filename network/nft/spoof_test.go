package nft_test

import (
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/phasegate/phasegate/internal/rawip"
	"github.com/phasegate/phasegate/network/internal/fakehost"
	"github.com/phasegate/phasegate/network/nft"
)

// portReflector is the outside network's UDP echo service.
const portReflector = 7005

// reflect echoes every datagram the outside network's reflector receives
// back to its sender, until the test ends.
func reflect(t *testing.T, h *fakehost.Host) netip.AddrPort {
	t.Helper()
	at := netip.AddrPortFrom(fakehost.OutsideUplink.Addr(), portReflector)
	ln := listenUDP(t, h.Outside, at)
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := ln.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			_, _ = ln.WriteToUDPAddrPort(buf[:n], from)
		}
	}()
	return at
}

// sendRaw sends a datagram from src to dst over a raw socket in the
// namespace at from, as a tenant with CAP_NET_RAW there can.
func sendRaw(t *testing.T, from string, src, dst netip.AddrPort, payload string) {
	t.Helper()
	if err := fakehost.Do(from, func() error { return rawip.Send(rawip.UDP(src, dst, []byte(payload))) }); err != nil {
		t.Fatal(err)
	}
}

// received reports whether ln gets a datagram carrying payload within wait.
func received(ln *net.UDPConn, payload string, wait time.Duration) bool {
	buf := make([]byte, 1500)
	for deadline := time.Now().Add(wait); time.Now().Before(deadline); {
		_ = ln.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
		n, _, err := ln.ReadFromUDPAddrPort(buf)
		if err == nil && string(buf[:n]) == payload {
			return true
		}
	}
	return false
}

// A slot that sends from another slot's address (or the host's, or any
// address not its own) has the datagram dropped before the host tracks or
// masquerades it, so the reply the outside would send never reaches the
// victim; the host's own rp_filter is off, as on many hosts. The same
// raw socket sending from the slot's own address gets its reply: the
// rule, not the method, is what stops the others.
func TestSpoofedSourceIsDropped(t *testing.T) {
	h := fakehost.New(t, 3, true)
	for _, key := range []string{"net/ipv4/conf/all/rp_filter", "net/ipv4/conf/default/rp_filter"} {
		if err := fakehost.Sysctl(h.Path, key, "0"); err != nil {
			t.Fatal(err)
		}
	}
	tbl := install(t, h, nft.Isolation{})
	refl := reflect(t, h)
	attacker, victim := h.Slots[0], h.Slots[1]

	// The positive control: the attacker's own address, the same raw path.
	own := netip.AddrPortFrom(attacker.InsideAddr.Addr(), 40000)
	ownLn := listenUDP(t, attacker.NetnsPath, own)
	var answered bool
	for try := 0; try < 50 && !answered; try++ {
		msg := fmt.Sprintf("own %d", try)
		sendRaw(t, attacker.NetnsPath, own, refl, msg)
		answered = received(ownLn, msg, 100*time.Millisecond)
	}
	if !answered {
		t.Fatal("a datagram from the slot's own address over a raw socket got no reply: the test cannot tell a drop from a broken path")
	}
	if d := drops(t, tbl); d.Spoofed != 0 {
		t.Fatalf("the slot's own address counted as spoofed (%d)", d.Spoofed)
	}

	victimPort := netip.AddrPortFrom(victim.InsideAddr.Addr(), 40001)
	victimLn := listenUDP(t, victim.NetnsPath, victimPort)
	for _, src := range []netip.AddrPort{
		victimPort, // the reply would be delivered into the victim
		netip.AddrPortFrom(victim.HostAddr.Addr(), 40002),   // another slot's gateway
		netip.AddrPortFrom(attacker.HostAddr.Addr(), 40003), // its own gateway (a host address)
		netip.AddrPortFrom(fakehost.HostUplink.Addr(), 40004),
		netip.AddrPortFrom(netip.MustParseAddr("198.51.100.7"), 40005), // anyone
	} {
		before := drops(t, tbl).Spoofed
		msg := "spoofed from " + src.String()
		sendRaw(t, attacker.NetnsPath, src, refl, msg)
		// Counted as dropped, and then nothing reaches the victim; or the
		// reply reached it, which is the attack.
		waitFor(t, "the spoofed datagram from "+src.String()+" counted as dropped or answered into the victim", func() bool {
			return drops(t, tbl).Spoofed > before || (src == victimPort && received(victimLn, msg, 10*time.Millisecond))
		})
		if drops(t, tbl).Spoofed == before || (src == victimPort && received(victimLn, msg, 300*time.Millisecond)) {
			t.Errorf("the datagram spoofed from %s was answered into the victim", src)
		}
	}
	// The victim itself is untouched: its own datagrams still get replies.
	if _, ok, err := fakehost.UDPReaches(victim.NetnsPath, listenUDP(t, h.Outside, netip.AddrPortFrom(fakehost.OutsideUplink.Addr(), 7006)), 5*time.Second); err != nil || !ok {
		t.Errorf("the victim no longer reaches the outside: %v", err)
	}
}

// waitFor polls cond every 10 ms for up to 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}
