package app

import (
	"fmt"
	"net"
	"os"
	"strings"
	"sync"

	"github.com/coreos/go-systemd/v22/activation"
	"golang.org/x/sys/unix"
)

// ListenFDName is the name (LISTEN_FDNAMES) under which the App looks for
// its port among inherited descriptors when more than one socket is
// handed over. systemd names a socket unit's descriptor after the unit
// ("phasegate.socket" gives "phasegate") unless FileDescriptorName= says
// otherwise.
const ListenFDName = "listen"

// inherited are the descriptors handed to this process by systemd socket
// activation (LISTEN_FDS, LISTEN_PID, LISTEN_FDNAMES), or by an earlier
// image of this process across an execve, which uses the same protocol.
type inherited struct {
	mu    sync.Mutex
	files map[string]*os.File // by name; taken ones are removed
}

// inheritFiles takes the descriptors from the environment (systemd's, and
// those of an in-place upgrade, see [UpgradeFDsEnv]), unsetting the
// variables so that child processes do not see them.
func inheritFiles() (*inherited, error) {
	in := &inherited{files: map[string]*os.File{}}
	for i, f := range activation.Files(true) {
		name := f.Name()
		if name == "" || name == "LISTEN_FD_"+fmt.Sprint(3+i) {
			name = fmt.Sprintf("fd%d", 3+i)
		}
		if _, dup := in.files[name]; dup {
			name = fmt.Sprintf("%s.%d", name, 3+i)
		}
		in.files[name] = f
	}
	return in, upgradeFiles(in)
}

// take removes and returns the named descriptor.
func (in *inherited) take(name string) *os.File {
	in.mu.Lock()
	defer in.mu.Unlock()
	f := in.files[name]
	delete(in.files, name)
	return f
}

// close closes every descriptor nobody took.
func (in *inherited) close() {
	in.mu.Lock()
	defer in.mu.Unlock()
	for name, f := range in.files {
		_ = f.Close()
		delete(in.files, name)
	}
}

// listener returns the port's listener: Config.Listener, else an inherited
// listening TCP socket, else nil (the server binds Config.Listen). More
// than one inherited listening socket must be told apart by name.
func (a *App) listener() (net.Listener, error) {
	if a.cfg.Listener != nil {
		return a.cfg.Listener, nil
	}
	a.inherit.mu.Lock()
	var names []string
	for name, f := range a.inherit.files {
		if isListeningSocket(f) && isInetSocket(f) {
			names = append(names, name)
		}
	}
	a.inherit.mu.Unlock()
	var pick string
	switch {
	case len(names) == 0:
		return nil, nil
	case len(names) == 1:
		pick = names[0]
	default:
		for _, n := range names {
			if n == ListenFDName || n == a.cfg.Name {
				pick = n
			}
		}
		if pick == "" {
			return nil, fmt.Errorf("%d listening sockets inherited (%s): name the port's %q or %q in LISTEN_FDNAMES",
				len(names), strings.Join(names, ", "), ListenFDName, a.cfg.Name)
		}
	}
	f := a.inherit.take(pick)
	l, err := net.FileListener(f)
	_ = f.Close() // FileListener made its own descriptor
	if err != nil {
		return nil, fmt.Errorf("inherited socket %q: %w", pick, err)
	}
	if _, ok := l.Addr().(*net.TCPAddr); !ok {
		_ = l.Close()
		return nil, fmt.Errorf("inherited socket %q is %s, not TCP", pick, l.Addr().Network())
	}
	return l, nil
}

// isListeningSocket reports whether f is a socket in the listening state.
func isListeningSocket(f *os.File) bool {
	return socketIs(f, func(fd int) bool {
		v, err := getsockoptInt(fd)
		return err == nil && v == 1
	})
}

// Inherited returns, and hands over to the caller, a descriptor this
// process inherited under name (LISTEN_FDNAMES) that is not the port:
// state an earlier image of the process passed on across an execve, such
// as a lock. It returns nil when there is none.
func (a *App) Inherited(name string) *os.File {
	return a.inherit.take(name)
}

// isInetSocket reports whether f is an IPv4 or IPv6 socket: a listening
// Unix socket handed over (a daemon's control socket) is not the port.
func isInetSocket(f *os.File) bool {
	return socketIs(f, func(fd int) bool {
		d, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN)
		return err == nil && (d == unix.AF_INET || d == unix.AF_INET6)
	})
}

// socketIs reports whether test holds of f's descriptor; false when f
// has none to give.
func socketIs(f *os.File, test func(fd int) bool) bool {
	sc, err := f.SyscallConn()
	if err != nil {
		return false
	}
	is := false
	_ = sc.Control(func(fd uintptr) { is = test(int(fd)) })
	return is
}

func getsockoptInt(fd int) (int, error) {
	return unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN)
}
