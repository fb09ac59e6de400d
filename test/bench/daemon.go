package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/phasegate/phasegate/phases"
)

// buildPhasegate builds ./cmd/phasegate (without -race) into dir.
func buildPhasegate(ctx context.Context, dir string) (string, error) {
	return build(ctx, dir, "phasegate", "github.com/phasegate/phasegate/cmd/phasegate")
}

// buildSerialBaseline builds the serial baseline (./serialbaseline, E2B's
// orchestrator's start on the library's parts) into dir, like the daemon.
func buildSerialBaseline(ctx context.Context, dir string) (string, error) {
	return build(ctx, dir, "serialbaseline", "github.com/phasegate/phasegate/test/bench/serialbaseline")
}

// build builds the main package pkg (without -race) into dir/name.
func build(ctx context.Context, dir, name, pkg string) (string, error) {
	bin := filepath.Join(dir, name)
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, pkg)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %w\n%s", pkg, err, out)
	}
	return bin, nil
}

// freeAddr returns a loopback address whose port nobody listens on now.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("free port: %w", err)
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// Reclaim modes of a daemon run.
const (
	modeBackground = "background" // the default: dead slots reclaimed after SERVING
	modeForeground = "foreground" // --reclaim=foreground: before the warm slots
	modeSerial     = "serial"     // not phasegate: ./serialbaseline, the E2B orchestrator's start
)

// slotArgs are the flags confining a daemon (or decommission) to h.
func slotArgs(h *host, o options) []string {
	return []string{
		"--state-dir=" + h.stateDir,
		"--netns-dir=" + h.cfg.NetnsDir,
		"--slot-prefix=" + h.cfg.Prefix,
		"--slots=" + strconv.Itoa(h.cfg.Slots),
		"--slot-cidr=" + h.cfg.CIDR.String(),
		"--reclaim-workers=" + strconv.Itoa(o.workers),
	}
}

// daemonArgs returns the serve flags of a daemon confined to h, with a warm
// pool of poolSize.
func daemonArgs(h *host, addr string, o options, mode string, poolSize int) []string {
	args := append([]string{"serve", "--listen=" + addr}, slotArgs(h, o)...)
	args = append(args,
		"--pool-size="+strconv.Itoa(poolSize),
		"--pool-min-ready=1",
		"--drain-delay=20ms",
		"--stop-timeout=5s",
		// A slow start is measured, not cut off at the default 5 min; the
		// report says when a start took longer than that default.
		"--start-timeout=0",
		// The Slots API's calls are measured, not the control surface's
		// per-principal rate limit (default 100 calls/s): the benchmark
		// calls as root, one principal, far faster than that.
		"--control-rate=0",
		"--log-format=json",
	)
	if mode == modeForeground {
		args = append(args, "--reclaim=foreground")
	}
	return args
}

// serialArgs returns the flags of the serial baseline confined to h, with
// the daemon's pool settings and stop bounds (daemonArgs).
func serialArgs(h *host, addr string, poolSize int) []string {
	return []string{
		"--listen=" + addr,
		"--netns-dir=" + h.cfg.NetnsDir,
		"--slot-prefix=" + h.cfg.Prefix,
		"--slots=" + strconv.Itoa(h.cfg.Slots),
		"--slot-cidr=" + h.cfg.CIDR.String(),
		"--pool-size=" + strconv.Itoa(poolSize),
		"--pool-min-ready=1",
		"--drain-delay=20ms",
		"--stop-timeout=5s",
	}
}

// daemon is a running phasegate process (the same process across in-place
// upgrades: an upgrade executes a new image with the same pid and the same
// output pipe).
type daemon struct {
	cmd  *exec.Cmd
	addr string
	// control is the path of its control socket, where the Slots API is
	// served: from --control-socket, else in --state-dir.
	control string
	began   time.Time
	// tlsClient is how the benchmark's own clients (the start's pollers, the
	// lifecycle view) reach a daemon started with --tls-cert: its
	// certificate, self-signed, as their only root; nil for plain text.
	tlsClient *tls.Config
	done      chan struct{} // closed when the process has exited
	err       error         // Wait's result, set before done is closed
	logs      *logTail
}

// heldSocketScript hands the inherited descriptor 3 to the daemon the way
// systemd's socket activation does: LISTEN_PID must be the daemon's own
// pid, known only after the fork, so a shell exports its own pid and then
// executes the daemon in its place.
const heldSocketScript = `export LISTEN_PID=$$; exec "$0" "$@"`

// startDaemon execs bin with args; began is taken right before the exec.
// With held, the daemon gets that listening socket as systemd socket
// activation gives it (LISTEN_FDS=1, descriptor 3) instead of binding its
// port.
func startDaemon(bin string, args []string, held *os.File) (*daemon, error) {
	d := &daemon{done: make(chan struct{}), logs: newLogTail(200)}
	var stateDir string
	if held == nil {
		d.cmd = exec.Command(bin, args...)
	} else {
		d.cmd = exec.Command("/bin/sh", append([]string{"-c", heldSocketScript, bin}, args...)...)
		d.cmd.ExtraFiles = []*os.File{held}
		d.cmd.Env = append(os.Environ(), "LISTEN_FDS=1", "LISTEN_FDNAMES=listen")
	}
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--listen="); ok {
			d.addr = v
		}
		// The last of a repeated flag counts, as in the daemon's.
		if v, ok := strings.CutPrefix(a, "--state-dir="); ok {
			stateDir = v
		}
		if v, ok := strings.CutPrefix(a, "--control-socket="); ok {
			d.control = v
		}
		if v, ok := strings.CutPrefix(a, "--tls-cert="); ok {
			cfg, err := clientTLS(v)
			if err != nil {
				return nil, err
			}
			d.tlsClient = cfg
		}
	}
	if d.control == "" && stateDir != "" {
		d.control = filepath.Join(stateDir, phases.ControlSocketName)
	}
	d.cmd.Stdout, d.cmd.Stderr = d.logs, d.logs
	d.began = time.Now()
	if err := d.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start phasegate: %w", err)
	}
	go func() {
		d.err = d.cmd.Wait()
		close(d.done)
	}()
	return d, nil
}

// slotsTarget is the gRPC target of its Slots API: its control socket.
func (d *daemon) slotsTarget() string {
	return "unix://" + d.control
}

// stop sends SIGTERM (the daemon drains and keeps its slots, recorded) and
// waits up to 30 s before killing it. It returns how long the process took
// to exit, and an error when it did not exit cleanly.
func (d *daemon) stop() (time.Duration, error) {
	select {
	case <-d.done:
		return 0, d.exitErr("exited before it was stopped")
	default:
	}
	t0 := time.Now()
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(30 * time.Second)
	defer t.Stop()
	select {
	case <-d.done:
		return time.Since(t0), d.exitErr("drain")
	case <-t.C:
		_ = d.cmd.Process.Kill()
		<-d.done
		return time.Since(t0), fmt.Errorf("phasegate did not stop within 30 s of SIGTERM; killed\n%s", d.logs)
	}
}

// kill ends the process at once (SIGKILL) and waits for it. Harmless on a
// process that has exited.
func (d *daemon) kill() {
	_ = d.cmd.Process.Kill()
	<-d.done
}

// exited reports whether the process has exited.
func (d *daemon) exited() bool {
	select {
	case <-d.done:
		return true
	default:
		return false
	}
}

// signal sends sig to the daemon.
func (d *daemon) signal(sig os.Signal) error {
	if err := d.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("signal %v to phasegate: %w", sig, err)
	}
	return nil
}

func (d *daemon) exitErr(what string) error {
	if d.err != nil {
		return fmt.Errorf("phasegate %s: %w\n%s", what, d.err, d.logs)
	}
	if what != "drain" {
		return fmt.Errorf("phasegate %s\n%s", what, d.logs)
	}
	return nil
}
