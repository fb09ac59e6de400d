package app

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// UpgradeFDsEnv carries the descriptors an App hands over to its new image
// across an in-place upgrade: "name=fd,name=fd". The new image takes them
// with [App.Inherited] (the port's listening socket under [ListenFDName]).
// systemd's LISTEN_FDS protocol would need the descriptors moved to 3, 4,
// …, which cannot be done safely in a running Go process: the runtime's
// own descriptors may be there.
const UpgradeFDsEnv = "PHASEGATE_UPGRADE_FDS"

// preflightTimeout bounds the check of the new binary before an upgrade.
const preflightTimeout = 30 * time.Second

// errUpgrade is how serving tells run that SIGHUP asked for an upgrade.
var errUpgrade = errors.New("in-place upgrade")

// Upgrading reports whether the App is draining for an in-place upgrade:
// a Stop function must then leave what the new image takes over (a lock
// handed over with [App.HandOver], durable state) as it is.
func (a *App) Upgrading() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.upgrading
}

// HandOver registers f to be passed, open, to the new image of this
// process across an in-place upgrade, where [App.Inherited](name) returns
// it. The caller keeps owning f until the exec; the App only clears its
// close-on-exec flag at the last moment.
func (a *App) HandOver(name string, f *os.File) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.handover == nil {
		a.handover = map[string]*os.File{}
	}
	a.handover[name] = f
}

// preflight runs the binary that the upgrade will execute with
// Config.UpgradePreflight and reports why it cannot be the new image:
// missing, not executable, crashing, or refusing the configuration.
// Nothing has been stopped when it fails.
func (a *App) preflight(ctx context.Context, path string) error {
	if len(a.cfg.UpgradePreflight) == 0 {
		if _, err := os.Stat(path); err != nil {
			return err
		}
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, preflightTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, a.cfg.UpgradePreflight...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	// The check must not take the descriptors this process was started
	// with, nor be mistaken for their owner.
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool {
		for _, k := range []string{"LISTEN_FDS=", "LISTEN_PID=", "LISTEN_FDNAMES=", UpgradeFDsEnv + "=", "NOTIFY_SOCKET="} {
			if strings.HasPrefix(kv, k) {
				return true
			}
		}
		return false
	})
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(out.String())
		if len(msg) > 500 {
			msg = msg[:500] + "…"
		}
		if msg != "" {
			return fmt.Errorf("%s %s: %w: %s", path, strings.Join(a.cfg.UpgradePreflight, " "), err, msg)
		}
		return fmt.Errorf("%s %s: %w", path, strings.Join(a.cfg.UpgradePreflight, " "), err)
	}
	return nil
}

// execUpgrade replaces this process's image with the binary at path (same
// pid, same arguments), handing over the port and the registered
// descriptors. It returns only when the exec failed; it then tries the
// image that is running now (/proc/self/exe, which the kernel keeps even
// when the file at path was replaced), so that the service comes back
// either way.
func (a *App) execUpgrade(path string) error {
	a.mu.Lock()
	files := maps.Clone(a.handover)
	a.mu.Unlock()
	var spec []string
	for name, f := range files {
		fd := int(f.Fd())
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, 0); err != nil {
			return fmt.Errorf("hand over %s (fd %d): clear close-on-exec: %w", name, fd, err)
		}
		spec = append(spec, name+"="+strconv.Itoa(fd))
	}
	slices.Sort(spec)
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, UpgradeFDsEnv+"=") || strings.HasPrefix(kv, "LISTEN_")
	})
	env = append(env, UpgradeFDsEnv+"="+strings.Join(spec, ","))
	a.log.Info("upgrading in place: exec", "binary", path, "handover", strings.Join(spec, ","))
	err := syscall.Exec(path, os.Args, env)
	a.log.Error("upgrade: exec of the new binary failed; restarting the running one", "binary", path, "error", err)
	if err2 := syscall.Exec("/proc/self/exe", os.Args, env); err2 != nil {
		return errors.Join(fmt.Errorf("exec %s: %w", path, err), fmt.Errorf("exec /proc/self/exe: %w", err2))
	}
	return nil // not reached
}

// upgradeFiles reads the descriptors an earlier image handed over.
func upgradeFiles(in *inherited) error {
	v, ok := os.LookupEnv(UpgradeFDsEnv)
	if !ok {
		return nil
	}
	os.Unsetenv(UpgradeFDsEnv)
	for _, item := range strings.Split(v, ",") {
		name, num, ok := strings.Cut(item, "=")
		fd, err := strconv.Atoi(num)
		if !ok || name == "" || err != nil || fd < 3 {
			return fmt.Errorf("%s=%q: want name=fd,…", UpgradeFDsEnv, v)
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			return fmt.Errorf("%s: descriptor %d (%s) is not open: %w", UpgradeFDsEnv, fd, name, err)
		}
		unix.CloseOnExec(fd)
		in.files[name] = os.NewFile(uintptr(fd), name)
	}
	return nil
}
