package server

import (
	"net"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The limiter's rules, step by step: a peer's bound, the total, the part
// kept for privileged peers and the part kept for permitted ones, what a
// release gives back, and zero as no bound.
func TestConnLimiter(t *testing.T) {
	var (
		root   = peerKey{uid: 0, local: true}
		owner  = peerKey{uid: selfUID, local: true}
		nobody = peerKey{uid: 65534, local: true}
		daemon = peerKey{uid: 1, local: true}
		remote = remotePeer(netip.MustParseAddr("192.0.2.7"))
		v6a    = remotePeer(netip.MustParseAddr("2001:db8::1"))
		v6b    = remotePeer(netip.MustParseAddr("2001:db8::2")) // same /64
	)
	admit, release, permit, unpermit := admitStep, releaseStep, permitStep, unpermitStep
	for _, tc := range []struct {
		name   string
		limits Limits
		steps  []limiterStep
		open   int
	}{
		{"per peer", Limits{MaxConnsPerPeer: 2},
			[]limiterStep{admit(nobody, admitted), admit(nobody, admitted), admit(nobody, overPeer), admit(daemon, admitted)}, 3},
		{"a release gives the share back", Limits{MaxConnsPerPeer: 1},
			[]limiterStep{admit(nobody, admitted), admit(nobody, overPeer), release(nobody), admit(nobody, admitted)}, 1},
		{"total", Limits{MaxConns: 3},
			[]limiterStep{admit(nobody, admitted), admit(daemon, admitted), admit(remote, admitted), admit(root, overTotal)}, 3},
		{"the privileged part is kept from the others", Limits{MaxConns: 4, PrivilegedConns: 2},
			[]limiterStep{admit(nobody, admitted), admit(daemon, admitted), admit(remote, overTotal), admit(nobody, overTotal),
				admit(root, admitted), admit(owner, admitted), admit(root, overTotal)}, 4},
		{"privileged peers may use all of it", Limits{MaxConns: 3, PrivilegedConns: 1, MaxConnsPerPeer: 1},
			[]limiterStep{admit(root, admitted), admit(root, admitted), admit(root, admitted), admit(nobody, overTotal)}, 3},
		{"privileged peers have no per-peer bound", Limits{MaxConnsPerPeer: 1},
			[]limiterStep{admit(root, admitted), admit(root, admitted), admit(owner, admitted), admit(owner, admitted)}, 4},
		{"a release of a privileged peer frees the total", Limits{MaxConns: 2, PrivilegedConns: 1},
			[]limiterStep{admit(root, admitted), admit(nobody, admitted), admit(daemon, overTotal), release(root), admit(daemon, overTotal),
				admit(root, admitted)}, 2},
		{"an IPv6 peer is its /64", Limits{MaxConnsPerPeer: 1},
			[]limiterStep{admit(v6a, admitted), admit(v6b, overPeer)}, 1},
		{"the permitted part is kept from ordinary peers", Limits{MaxConns: 6, PrivilegedConns: 1, PermittedConns: 3},
			[]limiterStep{admit(nobody, admitted), admit(daemon, admitted), admit(remote, overTotal),
				permit(nobody, admitted), permit(daemon, admitted), permit(remote, admitted), permit(v6a, overTotal),
				admit(root, admitted), admit(root, overTotal)}, 6},
		{"permitted peers may use the ordinary part too", Limits{MaxConns: 4, PrivilegedConns: 1, PermittedConns: 1},
			[]limiterStep{permit(nobody, admitted), permit(daemon, admitted), permit(remote, admitted), permit(v6a, overTotal),
				admit(v6a, overTotal), admit(root, admitted)}, 4},
		{"a permitted peer keeps its per-peer bound", Limits{MaxConns: 8, PermittedConns: 4, MaxConnsPerPeer: 2},
			[]limiterStep{permit(nobody, admitted), permit(nobody, admitted), permit(nobody, overPeer), admit(nobody, overPeer)}, 2},
		{"a permitted release frees the permitted part", Limits{MaxConns: 3, PrivilegedConns: 1, PermittedConns: 1},
			[]limiterStep{admit(nobody, admitted), permit(daemon, admitted), admit(remote, overTotal), unpermit(daemon),
				admit(remote, overTotal), permit(remote, admitted)}, 2},
		{"all but the privileged part permitted: ordinary peers get nothing", Limits{MaxConns: 4, PrivilegedConns: 1, PermittedConns: 3},
			[]limiterStep{admit(nobody, overTotal), permit(nobody, admitted), admit(root, admitted)}, 2},
		{"zero is no bound", Limits{},
			[]limiterStep{admit(nobody, admitted), admit(nobody, admitted), admit(nobody, admitted), admit(root, admitted)}, 4},
	} {
		t.Run(tc.name, func(t *testing.T) { runLimiterSteps(t, tc.limits, tc.steps, tc.open) })
	}
}

// selfUID is the uid the limiter's test runs as, which the gate classes
// privileged as it does root.
const selfUID = 1000

// limiterStep is a connection a peer of a class opens, and the refusal
// the limiter must answer, or one it closes (release).
type limiterStep struct {
	release bool
	p       peerKey
	class   PeerClass
	want    refusal
}

// gateClass is p's class as the gate gives it without Config.Admit.
func gateClass(p peerKey) PeerClass {
	if p.local && (p.uid == 0 || p.uid == selfUID) {
		return PeerPrivileged
	}
	return PeerOrdinary
}

// admitStep and releaseStep are the steps of a peer of the gate's class.
func admitStep(p peerKey, want refusal) limiterStep {
	return limiterStep{p: p, class: gateClass(p), want: want}
}

func releaseStep(p peerKey) limiterStep { return limiterStep{release: true, p: p, class: gateClass(p)} }

// permitStep and unpermitStep are the steps of a peer Config.Admit
// classes as permitted.
func permitStep(p peerKey, want refusal) limiterStep {
	return limiterStep{p: p, class: PeerPermitted, want: want}
}

func unpermitStep(p peerKey) limiterStep {
	return limiterStep{release: true, p: p, class: PeerPermitted}
}

// runLimiterSteps takes steps on a limiter of limits and checks each
// answer, and that open connections are counted at the end.
func runLimiterSteps(t *testing.T, limits Limits, steps []limiterStep, open int) {
	t.Helper()
	l := newConnLimiter(limits)
	for i, s := range steps {
		if s.release {
			l.release(s.p, s.class)
			continue
		}
		if got := l.admit(s.p, s.class); got != s.want {
			t.Fatalf("step %d: admit(%v, %v) = %d, want %d", i, s.p, s.class, got, s.want)
		}
	}
	if got, _ := l.counts(); got != open {
		t.Errorf("open %d, want %d", got, open)
	}
}

// Releasing everything leaves nothing counted: no peer entry is kept.
func TestConnLimiterForgetsIdlePeers(t *testing.T) {
	l := newConnLimiter(Limits{MaxConnsPerPeer: 3})
	var ps []peerKey
	for i := range 100 {
		p := remotePeer(netip.AddrFrom4([4]byte{192, 0, 2, byte(i)}))
		if l.admit(p, PeerOrdinary) != admitted {
			t.Fatal("refused below every bound")
		}
		ps = append(ps, p)
	}
	for _, p := range ps {
		l.release(p, PeerOrdinary)
	}
	if open, peers := l.counts(); open != 0 || peers != 0 {
		t.Errorf("after every release: %d open, %d peers remembered", open, peers)
	}
}

// The owner of the other end of a loopback connection is the user that
// made its socket, whatever source address it picked; a connection whose
// other end closed already has none (its time-wait stub would say uid 0).
func TestOwnerFinder(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	f := newOwnerFinder()
	defer f.close()
	find := func(c net.Conn) (uint32, error) {
		return f.owner(c.LocalAddr().(*net.TCPAddr).AddrPort(), c.RemoteAddr().(*net.TCPAddr).AddrPort())
	}
	uid := os.Geteuid()
	other := uid
	if uid == 0 {
		other = 65534 // a socket made with another fsuid is that user's
	}
	for _, tc := range []struct {
		name string
		uid  int
		src  string
	}{
		{"this user", uid, ""},
		{"another user", other, ""},
		{"another user from 127.0.0.2", other, "127.0.0.2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialFrom(t, tc.uid, tc.src, l.Addr().String())
			defer c.Close()
			got, err := find(c)
			if err != nil || got != uint32(tc.uid) {
				t.Fatalf("owner = %d, %v; want %d", got, err, tc.uid)
			}
		})
	}
	t.Run("closed", func(t *testing.T) {
		c := dialFrom(t, other, "", l.Addr().String())
		lp, rp := c.LocalAddr().(*net.TCPAddr).AddrPort(), c.RemoteAddr().(*net.TCPAddr).AddrPort()
		c.Close()
		if got, err := f.owner(lp, rp); err != errNoOwner {
			t.Fatalf("owner of a closed socket = %d, %v; want errNoOwner", got, err)
		}
	})
	t.Run("remote", func(t *testing.T) {
		if got, err := f.owner(netip.MustParseAddrPort("192.0.2.1:40000"), netip.MustParseAddrPort("127.0.0.1:5008")); err != errNoOwner {
			t.Fatalf("owner of a remote peer = %d, %v; want errNoOwner", got, err)
		}
	})
}

// dialFrom connects to addr from a socket made as uid (with its file
// system uid: the kernel's owner of a socket; root only for another uid),
// from source address src when given.
func dialFrom(t testing.TB, uid int, src, addr string) net.Conn {
	t.Helper()
	fd := socketAs(t, uid)
	if src != "" {
		if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: netip.MustParseAddr(src).As4()}); err != nil {
			unix.Close(fd)
			t.Fatal(err)
		}
	}
	ap := netip.MustParseAddrPort(addr)
	if err := unix.Connect(fd, &unix.SockaddrInet4{Addr: ap.Addr().As4(), Port: int(ap.Port())}); err != nil {
		unix.Close(fd)
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "socket")
	defer f.Close()
	c, err := net.FileConn(f)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// socketAs makes a TCP socket owned by uid: setfsuid changes the calling
// thread's credentials only, so it is done on a thread of its own.
func socketAs(t testing.TB, uid int) int {
	t.Helper()
	type made struct {
		fd  int
		err error
	}
	ch := make(chan made, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with its changed credentials
		if uid != os.Geteuid() {
			unix.Setfsuid(uid)
		}
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		ch <- made{fd, err}
	}()
	m := <-ch
	if m.err != nil {
		t.Fatal(m.err)
	}
	return m.fd
}

// The throttle lets one line a second through and counts the others.
func TestThrottle(t *testing.T) {
	var th throttle
	t0 := time.Unix(1000, 0)
	for i, tc := range []struct {
		at      time.Duration
		ok      bool
		skipped int
	}{
		{0, true, 0}, {100 * time.Millisecond, false, 0}, {900 * time.Millisecond, false, 0},
		{time.Second, true, 2}, {1500 * time.Millisecond, false, 0}, {3 * time.Second, true, 1},
	} {
		skipped, ok := th.allow(t0.Add(tc.at))
		if ok != tc.ok || skipped != tc.skipped {
			t.Errorf("line %d at %v: allow = %d, %v; want %d, %v", i, tc.at, skipped, ok, tc.skipped, tc.ok)
		}
	}
}

// Limits that mean nothing are refused by New, naming the field.
func TestLimitsValidate(t *testing.T) {
	for _, tc := range []struct {
		name  string
		l     Limits
		field string
	}{
		{"negative total", Limits{MaxConns: -1}, "MaxConns"},
		{"negative per peer", Limits{MaxConnsPerPeer: -1}, "MaxConnsPerPeer"},
		{"privileged above the total", Limits{MaxConns: 8, PrivilegedConns: 9}, "PrivilegedConns"},
		{"permitted above what the privileged part leaves", Limits{MaxConns: 8, PrivilegedConns: 2, PermittedConns: 7}, "PermittedConns"},
		{"negative permitted", Limits{PermittedConns: -1}, "PermittedConns"},
		{"negative message size", Limits{MaxRecvMsgSize: -1}, "MaxRecvMsgSize"},
		{"a window below HTTP/2's", Limits{Window: 1 << 10}, "Window"},
		{"negative header bytes", Limits{MaxHeaderBytes: -1}, "MaxHeaderBytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Addr, cfg.Limits = "127.0.0.1:0", tc.l
			if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), tc.field) {
				t.Errorf("New with %+v: %v, want an error naming %s", tc.l, err, tc.field)
			}
		})
	}
	for _, l := range []Limits{{}, DefaultLimits(), LimitsFor(1), {MaxConns: 8, PrivilegedConns: 8, Window: 64 << 10}, {MaxConns: 8, PrivilegedConns: 2, PermittedConns: 6}} {
		cfg := DefaultConfig()
		cfg.Addr, cfg.Limits = "127.0.0.1:0", l
		if _, err := New(cfg); err != nil {
			t.Errorf("New with %+v: %v", l, err)
		}
	}
}

// The connections of unprivileged peers being sniffed keep the open ones'
// share for permitted peers: the part PermittedConns is of MaxConns.
// Privileged peers' are not counted, so none is kept for them.
func TestSniffLimits(t *testing.T) {
	for _, tc := range []struct {
		l              Limits
		max, permitted int
	}{
		{Limits{MaxConns: 128, PrivilegedConns: 32, PermittedConns: 96, MaxSniffing: 128}, 128, 96},
		{Limits{MaxConns: 128, PrivilegedConns: 32, PermittedConns: 64, MaxSniffing: 64}, 64, 32},
		{Limits{MaxConns: 8, PrivilegedConns: 2, PermittedConns: 6, MaxSniffing: 128}, 128, 96},
		{Limits{MaxConns: 4096, PrivilegedConns: 64, MaxSniffing: 128}, 128, 0},
		{Limits{PermittedConns: 6, MaxSniffing: 16}, 16, 0},
	} {
		s := sniffLimits(tc.l)
		if s.MaxConns != tc.max || s.PrivilegedConns != 0 || s.PermittedConns != tc.permitted {
			t.Errorf("sniffLimits(%+v) = %d, %d privileged, %d permitted; want %d, none (privileged peers are not counted), %d", tc.l,
				s.MaxConns, s.PrivilegedConns, s.PermittedConns, tc.max, tc.permitted)
		}
		if errs := s.validate(); len(errs) != 0 {
			t.Errorf("sniffLimits(%+v) = %+v: %v", tc.l, s, errs)
		}
	}
}
