package phases

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
	"github.com/phasegate/phasegate/control"
	"github.com/phasegate/phasegate/phases/cniapi"
	"github.com/phasegate/phasegate/phases/slotsapi"
	"github.com/phasegate/phasegate/server"
	"github.com/phasegate/phasegate/tracing/grpccalls"
)

// ControlSocketName is the control socket's name in the state directory,
// where it is unless [ControlConfig.Socket] says otherwise.
const ControlSocketName = "control.sock"

// pathDebugSlots lists the slots as JSON on the control surface.
const pathDebugSlots = "GET /debug/slots"

// ControlConfig says where the daemon's control surface is and who may use
// it (docs/SECURITY.md). The Slots API and /debug/slots are served there:
// on the Unix socket, and over TCP on the port only to clients with a
// certificate that --tls-client-ca verifies.
type ControlConfig struct {
	// Socket is the control socket's path; empty is
	// <StateDir>/control.sock.
	Socket string
	// GID is the socket's group, whose members may connect (mode 0660);
	// -1 leaves the socket to root alone. When the socket is in the state
	// directory, the directory is made 0710 with this group, so that the
	// group can reach the socket and nothing else there.
	GID int
	// Policy says what each principal may do; nil lets root on the socket
	// do everything and nobody else anything. A policy that sets no
	// MaxLeases gets control.DefaultMaxLeases of Slots.Slots
	// ([Config.ControlPolicy]).
	Policy *control.AccessPolicy
}

// ControlSocket returns the control socket's path.
func (c Config) ControlSocket() string {
	if c.Control.Socket != "" {
		return c.Control.Socket
	}
	return filepath.Join(c.StateDir, ControlSocketName)
}

// ControlPolicy is the policy in force: Control.Policy, with the default
// quota of leases, a share of the slots, unless it sets one. One tenant
// so never leases every slot, whatever the flags forgot.
func (c Config) ControlPolicy() *control.AccessPolicy {
	p := c.Control.Policy
	if p == nil {
		p = &control.AccessPolicy{}
	}
	return p.WithDefaultMaxLeases(c.Slots.Slots)
}

// validateControl checks the control surface's settings without touching
// anything: the socket path must be a socket or nothing, in a directory
// that exists or is the state directory (made by the lock phase).
func (c Config) validateControl() error {
	path := c.ControlSocket()
	if !filepath.IsAbs(path) {
		return fmt.Errorf("--control-socket %q must be an absolute path", path)
	}
	if dir := filepath.Dir(path); dir == filepath.Clean(c.StateDir) {
		if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
			return nil
		}
	}
	return control.CheckPath(path)
}

// newGuard returns the guard of the Slots API on one surface.
func (d *Daemon) newGuard(surface string) (*control.Guard, error) {
	// Every mutating call is audited, allowed or refused.
	mutating := phasegatev1.SlotsMutatingMethods()
	var reads []string
	for _, m := range slotsapi.Desc().Methods {
		if !slices.Contains(mutating, m.MethodName) {
			reads = append(reads, m.MethodName)
		}
	}
	cniMutating, cniReads := cniapi.Methods()
	mutating, reads = append(mutating, cniMutating...), append(reads, cniReads...)
	heldMutating, heldReads := heldMethods()
	mutating, reads = append(mutating, heldMutating...), append(reads, heldReads...)
	return control.NewGuard(d.cfg.ControlPolicy(), control.GuardOptions{
		Service:       slotsapi.ServiceName,
		Mutating:      mutating,
		Reads:         reads,
		Surface:       surface,
		Logger:        d.log.With("audit", true),
		MeterProvider: d.app.MeterProvider(),
	})
}

// controlHandover names the control socket's descriptor across an
// in-place upgrade.
const controlHandover = "control"

// openControl binds the control socket — or takes the one the previous
// image handed over — and serves it at once: until the daemon serves,
// calls get Unavailable naming the phase, as on the port. It runs in the
// lock phase, after the locks: only their holder may replace a stale
// socket, and the socket lives as long as they do. A start that fails
// here leaves no socket behind.
func (d *Daemon) openControl(ctx context.Context) error {
	l, sock, err := d.bindControl(ctx)
	if err != nil {
		return err
	}
	srv, f, err := d.serveControl(ctx, l)
	if err != nil {
		_ = l.Close()
		return errors.Join(fmt.Errorf("control socket %s: %w", sock.Path, err), sock.Remove())
	}
	d.ctl.srv, d.ctl.socket, d.ctl.file = srv, sock, f
	d.state.bound()
	d.obs.watchConns("socket", srv)
	d.app.HandOver(controlHandover, f)
	d.log.Info("control socket", "path", sock.Path, "gid", d.cfg.Control.GID, "mode", control.SocketMode.String())
	return nil
}

// bindControl takes the socket an upgrade handed over, or binds a new one
// (letting the socket's group reach it through the state directory). A
// path that cannot be the socket is a configuration error: exit 2.
func (d *Daemon) bindControl(ctx context.Context) (*net.UnixListener, *control.Socket, error) {
	path := d.cfg.ControlSocket()
	if f := d.app.Inherited(controlHandover); f != nil {
		defer f.Close() // Adopt makes its own descriptor
		if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
			return control.Adopt(f, path)
		}
		// Removed from outside while the previous image served (the
		// control-socket warning said so): nobody can reach the socket
		// handed over, so it is let go and the path bound again.
		d.log.Warn("the control socket handed over was removed from outside the daemon: bound again", "path", path)
	}
	if gid := d.cfg.Control.GID; gid >= 0 && filepath.Dir(path) == filepath.Clean(d.cfg.StateDir) {
		if err := control.OpenDir(d.cfg.StateDir, gid); err != nil {
			return nil, nil, fmt.Errorf("%w: %w", ErrConfig, err)
		}
	}
	l, sock, err := control.Listen(ctx, path, control.SocketOptions{GID: d.cfg.Control.GID})
	if errors.Is(err, control.ErrSocket) && !ioFault(err) {
		return nil, nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return l, sock, err
}

// ioFault reports whether err is the filesystem failing (full, read-only,
// an I/O error) rather than a path that cannot be: exit 1, not 2.
func ioFault(err error) bool {
	for _, e := range []error{unix.ENOSPC, unix.EDQUOT, unix.EROFS, unix.EIO} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// serveControl serves the Slots API, /debug/slots and the CNI plugin's
// routes on l, behind the socket's guard, which admits at accept only the
// peers its policy grants something, and returns the server and a
// duplicate of l's descriptor for an upgrade. Every route there spends
// its caller's rate:
// each gRPC call (the Slots API, reflection, a method nobody serves) at the
// tap, before its request is read; each further message of a stream; and
// /debug/slots, bound behind d.ctl.guard with the slots.
func (d *Daemon) serveControl(ctx context.Context, l *net.UnixListener) (*server.Server, *os.File, error) {
	guard, err := d.newGuard("socket")
	if err != nil {
		return nil, nil, err
	}
	sc := server.DefaultConfig()
	sc.Listener, sc.Limits, sc.Logger = l, d.fds.Control, d.log.With("surface", "socket")
	// A uid the policy grants nothing is closed at accept: it would hold
	// connections the principals need, for calls that are all refused.
	sc.Admit = guard.Admit
	// The lifecycle's drain has closed the gate already when this one
	// drains: no delay is needed for calls to see it.
	sc.DrainDelay, sc.StopTimeout = 0, d.cfg.StopTimeout
	sc.Gate = server.LifecycleGate(d.lc)
	sc.GRPCOptions = []grpc.ServerOption{
		grpccalls.ServerOption(d.app.TracerProvider(), d.app.MeterProvider()),
		grpc.InTapHandle(guard.Tap),
		grpc.ChainUnaryInterceptor(d.obs.timeAcquire, guard.Intercept),
		grpc.ChainStreamInterceptor(guard.InterceptStream),
	}
	srv, err := server.New(sc)
	if err != nil {
		return nil, nil, err
	}
	if err := srv.Declare(slotsapi.Desc()); err != nil {
		return nil, nil, err
	}
	if err := srv.DeclareHTTP(pathDebugSlots); err != nil {
		return nil, nil, err
	}
	// The CNI plugin's routes: until the daemon serves, a call gets 503
	// naming the phase, which STATUS turns into error 50.
	for _, p := range cniapi.Patterns() {
		if err := srv.DeclareHTTP(p); err != nil {
			return nil, nil, err
		}
	}
	// The operator's routes for the held slots (`phasegate held`).
	for _, r := range heldRoutes(nil) {
		if err := srv.DeclareHTTP(r.Pattern); err != nil {
			return nil, nil, err
		}
	}
	f, err := l.File()
	if err != nil {
		return nil, nil, fmt.Errorf("duplicate for handover: %w", err)
	}
	if err := srv.Serve(ctx); err != nil {
		_ = f.Close()
		return nil, nil, err
	}
	d.ctl.guard = guard
	return srv, f, nil
}

// closeControl drains the control socket. An upgrade hands it on, open,
// to the new image; any other stop removes it.
func (d *Daemon) closeControl(ctx context.Context) error {
	if d.ctl.srv == nil {
		return nil
	}
	if d.app.Upgrading() {
		d.ctl.srv.DrainForHandover()
		return d.ctl.srv.Drain(ctx)
	}
	err := d.ctl.srv.Drain(ctx)
	rerr := d.ctl.socket.Remove()
	if errors.Is(rerr, fs.ErrNotExist) {
		rerr = nil // its directory is gone (removed from outside): nothing to remove
	}
	return errors.Join(err, rerr, d.ctl.file.Close())
}
