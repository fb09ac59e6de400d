package phases

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/network/leases"
	"github.com/phasegate/phasegate/phases/lease"
)

// The state directory holds what the daemon cannot serve without: the
// records (every lease is written there before Acquire answers) and the
// control socket. Its faults are components of health (DESIGN.md §6,
// "Faults"): the state-dir warning names a full or read-only filesystem,
// a write of the records that failed and why, and a state file or
// directory removed from outside; the control-socket warning a socket
// removed or replaced. Writes report as they go (slotRecords calls
// wrote), the rest is checked every --reconcile-interval by the watch
// task.

// stateFault reports whether err is a fault of the state filesystem
// rather than of the write: no space (or quota), read-only, an I/O error,
// a permission the daemon lost. Such a fault fails every write alike
// until an operator acts.
func stateFault(err error) bool {
	return err != nil && (errors.Is(err, leases.ErrNoSpace) || errors.Is(err, syscall.EROFS) ||
		errors.Is(err, syscall.EIO) || errors.Is(err, fs.ErrPermission))
}

// fileID is a file's identity, to tell it from one put at its path since.
type fileID struct{ dev, ino uint64 }

// lstatID returns the identity of the file at path.
func lstatID(path string) (fileID, error) {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return fileID{}, err
	}
	return fileID{dev: st.Dev, ino: st.Ino}, nil
}

// stateWatch keeps what is known of the state directory's health and
// says it in the state-dir and control-socket warnings.
type stateWatch struct {
	dir, file, socket string
	health            lease.Warnings
	log               *slog.Logger

	mu        sync.Mutex
	writeErr  error // the last write's state fault; nil once a write succeeds
	writeAt   time.Time
	fileID    fileID // the state file's, once opened
	sockID    fileID // the control socket's, once bound
	fsFault   string // what the last check found of the filesystem
	fileFault string
	sockFault string
}

func newStateWatch(cfg Config, log *slog.Logger) *stateWatch {
	return &stateWatch{dir: cfg.StateDir, file: cfg.StatePath(), socket: cfg.ControlSocket(), log: log}
}

// opened notes the state file's identity, once the store has it open.
func (w *stateWatch) opened() { w.identify(w.file, &w.fileID) }

// bound notes the control socket's identity, once it is bound (or taken
// over from the image before an upgrade).
func (w *stateWatch) bound() { w.identify(w.socket, &w.sockID) }

// identify notes the identity of path in *id (under w.mu), if it has one.
func (w *stateWatch) identify(path string, id *fileID) {
	got, err := lstatID(path)
	w.mu.Lock()
	defer w.mu.Unlock()
	if err == nil {
		*id = got
	}
}

// wrote is told the outcome of every write of the records: a state fault
// is said at once, with what the filesystem looks like then, and a write
// that succeeds clears it (a full filesystem stays said while the check
// finds it full: a small write may fit where a larger one failed).
func (w *stateWatch) wrote(err error) {
	if err != nil && !stateFault(err) {
		return // refused on its own merits: says nothing of the directory
	}
	w.mu.Lock()
	changed := (w.writeErr == nil) != (err == nil)
	w.writeErr = err
	if err != nil {
		w.writeAt = time.Now()
	}
	w.mu.Unlock()
	if changed {
		if err != nil {
			w.log.Error("the records cannot be written: the state directory is at fault", "dir", w.dir, "error", err)
		} else {
			w.log.Info("the records are written again", "dir", w.dir)
		}
		w.look()
		w.publish()
	}
}

// check looks at the state directory's filesystem, the state file and
// the control socket, and says what it found.
func (w *stateWatch) check() {
	if w.look() {
		w.publish()
	}
}

// look reads the state directory's filesystem, the state file and the
// control socket, and reports whether what it found changed.
func (w *stateWatch) look() bool {
	var fsFault string
	var st unix.Statfs_t
	switch err := unix.Statfs(w.dir, &st); {
	case errors.Is(err, unix.ENOENT):
		fsFault = "the directory is gone (removed from outside the daemon)"
	case err != nil:
		fsFault = fmt.Sprintf("the directory cannot be checked: %v", err)
	case st.Flags&unix.ST_RDONLY != 0:
		fsFault = "its filesystem is read-only"
	case st.Bavail == 0:
		fsFault = fmt.Sprintf("its filesystem is full (0 of %d KiB free): a write of the records that does not fit fails, and with it the Acquire, KeepAlive, Release or policy change that made it (ResourceExhausted); free space there",
			st.Blocks*uint64(st.Bsize)>>10)
	}
	w.mu.Lock()
	fileFault := moved(w.file, w.fileID, "state file", "the records live on in the file the daemon holds open, which a restart will not find: do not restart before the state is restored")
	sockFault := moved(w.socket, w.sockID, "control socket", "the Slots API is not reachable there (the port still serves); an upgrade in place (SIGHUP) binds it again and keeps every lease, unless the state-dir warning says the state file is gone too")
	changed := fsFault != w.fsFault || fileFault != w.fileFault || sockFault != w.sockFault
	w.fsFault, w.fileFault, w.sockFault = fsFault, fileFault, sockFault
	w.mu.Unlock()
	if changed && (fsFault != "" || fileFault != "" || sockFault != "") {
		w.log.Warn("state directory check", "dir", w.dir, "filesystem", fsFault, "state_file", fileFault, "control_socket", sockFault)
	}
	return changed
}

// moved says what became of the file at path whose identity was noted as
// id (zero: never noted), or "" when it is still there: gone, or another
// file in its place, and then what it means (then).
func moved(path string, id fileID, what, then string) string {
	if id == (fileID{}) {
		return ""
	}
	now, err := lstatID(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Sprintf("%s %s was removed from outside the daemon: %s", what, path, then)
	case err != nil:
		return fmt.Sprintf("%s %s cannot be checked: %v", what, path, err)
	case now != id:
		return fmt.Sprintf("%s %s was replaced from outside the daemon: %s", what, path, then)
	}
	return ""
}

// publish sets or clears the state-dir and control-socket warnings.
func (w *stateWatch) publish() {
	if w.health == nil {
		return
	}
	w.mu.Lock()
	var parts []string
	if w.fsFault != "" {
		parts = append(parts, w.fsFault)
	}
	if w.writeErr != nil {
		parts = append(parts, fmt.Sprintf("the records could not be written (at %s): %v: %s",
			w.writeAt.UTC().Format(time.TimeOnly), w.writeErr, writeConsequence(w.writeErr)))
	}
	if w.fileFault != "" {
		parts = append(parts, w.fileFault)
	}
	stateMsg := ""
	if len(parts) > 0 {
		stateMsg = fmt.Sprintf("state directory %s: %s", w.dir, strings.Join(parts, "; "))
	}
	sockMsg := w.sockFault
	w.mu.Unlock()
	for _, warn := range []struct{ name, msg string }{{warnStateDir, stateMsg}, {warnControlSocket, sockMsg}} {
		if warn.msg == "" {
			w.health.ClearWarning(warn.name)
		} else {
			w.health.Warn(warn.name, warn.msg)
		}
	}
}

// writeConsequence says what a write fault means for the leases' owners
// and what the operator does.
func writeConsequence(err error) string {
	if errors.Is(err, leases.ErrNoSpace) {
		return "Acquire, KeepAlive, Release and policy changes fail with ResourceExhausted until there is space again; free space there"
	}
	return "Acquire, KeepAlive, Release and policy changes fail until a write succeeds; make the directory writable again"
}
