package microvm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/network/netns"
)

// QEMU is the emulator Start runs (from the qemu-system-x86 package).
const QEMU = "qemu-system-x86_64"

// Guest is a built guest: the files QEMU boots.
type Guest struct {
	Kernel string // the kernel image (vmlinuz)
	Initrd string // the initramfs with busybox, the virtio modules and init
}

// Locate returns the guest that tools/guest/build.sh built: the directory
// PHASEGATE_GUEST names, or else the one the script prints when run from
// repo (the repository's root). It fails, saying why, when QEMU is not
// installed or the guest's files are missing.
func Locate(ctx context.Context, repo string) (Guest, error) {
	if _, err := exec.LookPath(QEMU); err != nil {
		return Guest{}, fmt.Errorf("this machine cannot run the guest: %w (tools/deps.sh installs qemu-system-x86)", err)
	}
	dir := os.Getenv("PHASEGATE_GUEST")
	if dir == "" {
		script := filepath.Join(repo, "tools", "guest", "build.sh")
		cmd := exec.CommandContext(ctx, script)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return Guest{}, fmt.Errorf("this machine cannot build the guest: %s: %w: %s", script, err, strings.TrimSpace(stderr.String()))
		}
		dir = strings.TrimSpace(string(out))
	}
	g := Guest{Kernel: filepath.Join(dir, "vmlinuz"), Initrd: filepath.Join(dir, "initrd.img")}
	for _, f := range []string{g.Kernel, g.Initrd} {
		if fi, err := os.Stat(f); err != nil {
			return Guest{}, fmt.Errorf("this machine cannot run the guest: %w (tools/guest/build.sh builds it)", err)
		} else if fi.Size() == 0 {
			return Guest{}, fmt.Errorf("this machine cannot run the guest: %s is empty (tools/guest/build.sh rebuilds it)", f)
		}
	}
	return g, nil
}

// Config is one VM: where it runs and what its init is told.
type Config struct {
	Netns   string           // the namespace's file (a bind mount or /proc/PID/ns/net)
	Tap     string           // the tap device inside Netns that QEMU opens
	MAC     net.HardwareAddr // the guest NIC's MAC
	Addr    netip.Prefix     // the guest's address and prefix on eth0
	Gateway netip.Addr       // its default route's gateway
	Port    uint16           // its TCP echo server's port
	Probes  []netip.AddrPort // addresses it checks outbound, one console line per check
	Hold    netip.AddrPort   // an address it keeps one connection open to (zero: none)
	Console string           // the file QEMU writes the serial console to
	Memory  int              // MiB of guest memory (0: 256)
}

// cmdline is the kernel command line that carries c to the guest's init.
func (c Config) cmdline() string {
	words := []string{"console=ttyS0", "panic=-1", "quiet",
		"pg.addr=" + c.Addr.String(), "pg.gw=" + c.Gateway.String(), "pg.port=" + strconv.Itoa(int(c.Port))}
	if len(c.Probes) > 0 {
		ps := make([]string, len(c.Probes))
		for i, p := range c.Probes {
			ps[i] = p.String()
		}
		words = append(words, "pg.probe="+strings.Join(ps, ","))
	}
	if c.Hold.IsValid() {
		words = append(words, "pg.hold="+c.Hold.String())
	}
	return strings.Join(words, " ")
}

// VM is a running QEMU process. Its owner calls Stop (a test registers it
// with t.Cleanup).
type VM struct {
	cfg  Config
	cmd  *exec.Cmd
	done chan struct{} // closed when the process is reaped
	err  error         // its exit, set before done closes
}

// Start boots g with c and returns at once; the guest answers on its echo
// port a few seconds later (WaitReady).
func Start(ctx context.Context, g Guest, c Config) (*VM, error) {
	if c.Memory == 0 {
		c.Memory = 256
	}
	if !c.Addr.IsValid() || !c.Gateway.IsValid() || c.Port == 0 || c.Tap == "" || c.Netns == "" || c.Console == "" || len(c.MAC) != 6 {
		return nil, fmt.Errorf("microvm: incomplete config %+v", c)
	}
	args := []string{"--net=" + c.Netns, "--", QEMU,
		"-accel", "tcg", "-m", strconv.Itoa(c.Memory), "-smp", "1",
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-serial", "file:" + c.Console,
		"-kernel", g.Kernel, "-initrd", g.Initrd, "-append", c.cmdline(),
		"-netdev", "tap,id=n0,ifname=" + c.Tap + ",script=no,downscript=no",
		"-device", "virtio-net-pci,netdev=n0,mac=" + c.MAC.String(),
	}
	cmd := exec.CommandContext(ctx, "nsenter", args...)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	// nsenter execs QEMU: the pid is QEMU's, so signals reach it. If the
	// test binary dies, the kernel kills QEMU (Pdeathsig). That signal
	// follows the thread that forked, not the process, so the fork is
	// made on a thread locked for the VM's whole life: a thread handed
	// back to the scheduler may end with some other goroutine (one that
	// entered a namespace and never unlocked) and take QEMU with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 5 * time.Second
	vm := &VM{cfg: c, cmd: cmd, done: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		defer close(vm.done)
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			vm.err = err
			started <- fmt.Errorf("microvm: start %s: %w", cmd.Args, err)
			return
		}
		started <- nil
		err := cmd.Wait()
		if err != nil && out.Len() > 0 {
			err = fmt.Errorf("%w: %s", err, strings.TrimSpace(out.String()))
		}
		vm.err = err
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return vm, nil
}

// Exited reports whether QEMU has exited, and how.
func (vm *VM) Exited() (bool, error) {
	select {
	case <-vm.done:
		return true, vm.err
	default:
		return false, nil
	}
}

// Stop ends QEMU: SIGTERM, then SIGKILL after grace, and reaps it. It is
// safe to call more than once.
func (vm *VM) Stop(grace time.Duration) error {
	if exited, _ := vm.Exited(); exited {
		return nil
	}
	_ = vm.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-vm.done:
		return nil
	case <-time.After(grace):
	}
	_ = vm.cmd.Process.Kill()
	<-vm.done
	return nil
}

// Console is everything the guest has written to its console so far.
func (vm *VM) Console() (string, error) {
	b, err := os.ReadFile(vm.cfg.Console)
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	return string(b), err
}

// WaitConsole waits until a console line from byte offset from on matches
// re, and returns that line and the offset just past it. It fails early
// when QEMU exits or the guest reports an error.
func (vm *VM) WaitConsole(ctx context.Context, from int, re *regexp.Regexp) (string, int, error) {
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		text, err := vm.Console()
		if err != nil {
			return "", 0, err
		}
		off := from
		for off < len(text) {
			nl := strings.IndexByte(text[off:], '\n')
			if nl < 0 {
				break // a line still being written
			}
			line := strings.TrimRight(text[off:off+nl], "\r")
			off += nl + 1
			if re.MatchString(line) {
				return line, off, nil
			}
			if strings.HasPrefix(line, "guest error") {
				return "", 0, fmt.Errorf("microvm: the guest says %q", line)
			}
		}
		if exited, err := vm.Exited(); exited {
			return "", 0, fmt.Errorf("microvm: qemu exited (%v) before %q; console:\n%s", err, re, text)
		}
		select {
		case <-ctx.Done():
			return "", 0, fmt.Errorf("microvm: no console line %q: %w; console:\n%s", re, ctx.Err(), text)
		case <-tick.C:
		}
	}
}

// WaitReady waits until the guest's echo server answers at addr from
// inside namespace ns, polling every half second.
func (vm *VM) WaitReady(ctx context.Context, ns string, addr netip.AddrPort) error {
	var last error
	for {
		if exited, err := vm.Exited(); exited {
			text, _ := vm.Console()
			return fmt.Errorf("microvm: qemu exited (%v) before the guest answered; console:\n%s", err, text)
		}
		if last = Echo(ctx, ns, addr); last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			text, _ := vm.Console()
			return fmt.Errorf("microvm: the guest at %s never answered (last: %v): %w; console:\n%s", addr, last, ctx.Err(), text)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// Echo connects to addr from inside ns, sends a line and checks that the
// same line comes back within a second.
func Echo(ctx context.Context, ns string, addr netip.AddrPort) error {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	c, err := Dial(ctx, ns, addr)
	if err != nil {
		return err
	}
	defer c.Close()
	return EchoOn(c, time.Second)
}

// EchoOn sends one line on c and checks that it comes back within timeout.
func EchoOn(c net.Conn, timeout time.Duration) error {
	msg := fmt.Sprintf("echo %d\n", time.Now().UnixNano())
	if err := c.SetDeadline(time.Now().Add(timeout)); err != nil {
		return err
	}
	if _, err := c.Write([]byte(msg)); err != nil {
		return fmt.Errorf("write to %s: %w", c.RemoteAddr(), err)
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil {
		return fmt.Errorf("read from %s: %w", c.RemoteAddr(), err)
	}
	if string(buf) != msg {
		return fmt.Errorf("echo from %s: got %q, want %q", c.RemoteAddr(), buf, msg)
	}
	return nil
}

// Dial connects to addr over TCP from inside the namespace ns ("" is the
// caller's own). The socket stays in ns for its whole life.
func Dial(ctx context.Context, ns string, addr netip.AddrPort) (net.Conn, error) {
	var c net.Conn
	err := InNamespace(ns, func() error {
		var d net.Dialer
		var err error
		c, err = d.DialContext(ctx, "tcp4", addr.String())
		return err
	})
	return c, err
}

// InNamespace runs f on an OS thread that entered the network namespace
// bound at ns ("" runs f on the caller's), with the library's netns.Do: the
// thread is never unlocked and ends with its goroutine rather than carry
// the namespace to other code. Sockets f makes stay in ns for their life.
func InNamespace(ns string, f func() error) error {
	if ns == "" {
		return f()
	}
	fd, err := netns.Open(ns)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return netns.Do(fd, f)
}
