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
	a.handover[name] = f
}

// prepareUpgrade does what a SIGHUP does before the drain of an upgrade:
// it opens the binary at the App's path, reads the configuration files
// again (Config.ConfigFiles), checks that binary with them, and takes the
// port's socket to hand over. It reports whether the upgrade goes ahead;
// when it does not, it has said why in the log and nothing was stopped.
func (a *App) prepareUpgrade(ctx context.Context) bool {
	// The file checked is the one executed, by its descriptor: a binary
	// put at the path during the drain waits for the next SIGHUP.
	bin, err := os.Open(a.execPath)
	if err != nil {
		a.log.Error("SIGHUP: upgrade refused, the new binary failed its check; still serving", "binary", a.execPath, "error", err)
		return false
	}
	snap, err := a.cfg.ConfigFiles.snapshot()
	if err != nil {
		_ = bin.Close()
		a.log.Error("SIGHUP: upgrade refused, a configuration file failed its check; still serving", "error", err)
		return false
	}
	in := &upgradeInputs{bin: bin, files: snap}
	if err := a.preflight(ctx, in); err != nil {
		in.close()
		a.log.Error("SIGHUP: upgrade refused, the new binary failed its check; still serving", "binary", a.execPath, "error", err)
		return false
	}
	// The port's socket, kept open across the drain: its backlog holds
	// the connections that arrive meanwhile.
	f, err := a.srv.ListenerFile()
	if err != nil {
		in.close()
		a.log.Error("SIGHUP: upgrade refused; still serving", "error", err)
		return false
	}
	for _, e := range snap.entries {
		a.log.Info("SIGHUP: configuration file read and checked for the new image", "path", e.Path, "size", e.Size, "sha256", e.SHA256)
	}
	a.mu.Lock()
	a.upgradeIn = in
	a.mu.Unlock()
	a.HandOver(ListenFDName, f)
	a.srv.DrainForHandover()
	a.log.Info("SIGHUP: upgrading in place", "binary", a.execPath)
	return true
}

// upgradeInputs are what an upgrade checked at its SIGHUP and hands to the
// new image: the binary, open, and the configuration files read.
type upgradeInputs struct {
	bin   *os.File
	files *configSnapshot
}

// close closes both; nil-safe.
func (in *upgradeInputs) close() {
	if in == nil {
		return
	}
	_ = in.bin.Close()
	in.files.close()
}

// preflight runs the binary that the upgrade will execute (in.bin) with
// Config.UpgradePreflight, handing it the configuration files in
// in.files as the new image will be handed them, and reports why it
// cannot be the new image: not executable, crashing, or refusing the
// configuration. Nothing has been stopped when it fails.
func (a *App) preflight(ctx context.Context, in *upgradeInputs) error {
	if len(a.cfg.UpgradePreflight) == 0 {
		return nil // it exists: it was opened
	}
	// The open binary, by a path the child can execute whatever is at
	// the App's path by then; a script there is handed the same path,
	// which stays open until the check ends.
	path := fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), in.bin.Fd())
	snap := in.files
	ctx, cancel := context.WithTimeout(ctx, preflightTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, a.cfg.UpgradePreflight...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	// The check must not take the descriptors this process was started
	// with, nor be mistaken for their owner.
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool {
		for _, k := range []string{"LISTEN_FDS=", "LISTEN_PID=", "LISTEN_FDNAMES=", UpgradeFDsEnv + "=", UpgradeFilesEnv + "=", "NOTIFY_SOCKET="} {
			if strings.HasPrefix(kv, k) {
				return true
			}
		}
		return false
	})
	// The configuration files at descriptors 3, 4, …, as ExtraFiles puts
	// them: the check reads what the new image will read.
	if len(snap.files) > 0 {
		cmd.ExtraFiles = snap.files
		cmd.Env = append(cmd.Env, UpgradeFilesEnv+"="+snap.env(func(i int) int { return 3 + i }))
	}
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(out.String())
		if len(msg) > 500 {
			msg = msg[:500] + "…"
		}
		if msg != "" {
			return fmt.Errorf("%s %s: %w: %s", a.execPath, strings.Join(a.cfg.UpgradePreflight, " "), err, msg)
		}
		return fmt.Errorf("%s %s: %w", a.execPath, strings.Join(a.cfg.UpgradePreflight, " "), err)
	}
	return nil
}

// execUpgrade replaces this process's image with the binary checked at
// SIGHUP (same pid, same arguments), handing over the port, the
// registered descriptors and the configuration files read at SIGHUP. It
// returns only when the exec failed; it then tries the image that is
// running now (/proc/self/exe, which the kernel keeps even when the file
// at the App's path was replaced), handing it the same, so that the
// service comes back either way.
func (a *App) execUpgrade() error {
	a.mu.Lock()
	files, in := maps.Clone(a.handover), a.upgradeIn
	a.mu.Unlock()
	var spec []string
	for name, f := range files {
		fd := int(f.Fd())
		if err := inheritable(f); err != nil {
			return fmt.Errorf("hand over %s (fd %d): %w", name, fd, err)
		}
		spec = append(spec, name+"="+strconv.Itoa(fd))
	}
	slices.Sort(spec)
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, UpgradeFDsEnv+"=") || strings.HasPrefix(kv, UpgradeFilesEnv+"=") || strings.HasPrefix(kv, "LISTEN_")
	})
	env = append(env, UpgradeFDsEnv+"="+strings.Join(spec, ","))
	if snap := in.files; len(snap.files) > 0 {
		for _, f := range snap.files {
			if err := inheritable(f); err != nil {
				return fmt.Errorf("hand over %s: %w", f.Name(), err)
			}
		}
		env = append(env, UpgradeFilesEnv+"="+snap.env(func(i int) int { return int(snap.files[i].Fd()) }))
	}
	a.log.Info("upgrading in place: exec", "binary", a.execPath, "handover", strings.Join(spec, ","))
	// The kernel opens the file before it closes the close-on-exec
	// descriptors, this one among them.
	err := syscall.Exec("/proc/self/fd/"+strconv.Itoa(int(in.bin.Fd())), os.Args, env)
	a.log.Error("upgrade: exec of the new binary failed; restarting the running one", "binary", a.execPath, "error", err)
	if err2 := syscall.Exec("/proc/self/exe", os.Args, env); err2 != nil {
		return errors.Join(fmt.Errorf("exec %s: %w", a.execPath, err), fmt.Errorf("exec /proc/self/exe: %w", err2))
	}
	return nil // not reached
}

// inheritable clears f's close-on-exec flag, at the last moment before
// the exec that hands it over.
func inheritable(f *os.File) error {
	if _, err := unix.FcntlInt(f.Fd(), unix.F_SETFD, 0); err != nil {
		return fmt.Errorf("clear close-on-exec: %w", err)
	}
	return nil
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
