package netns

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// Creds is what the kernel's capability rule reads of a process to decide
// whether it may enter a namespace (setns(2), user_namespaces(7)
// "Capability rules"): its effective uid, its user namespace and whether
// CAP_SYS_ADMIN is in its effective set, which is a capability in that
// user namespace.
type Creds struct {
	// EUID is the effective uid as this process's user namespace names it
	// (the host's: the kernel's uid).
	EUID uint32
	// UserNS is the process's user namespace.
	UserNS ID
	// SysAdmin says CAP_SYS_ADMIN is in the effective set.
	SysAdmin bool
}

// ErrProcessGone is wrapped by [ReadCreds]'s error when the process ended
// before its credentials were read.
var ErrProcessGone = errors.New("netns: the process is gone")

// capSysAdmin is CAP_SYS_ADMIN's bit in /proc/<pid>/status's CapEff.
const capSysAdmin = 21

// ReadCreds reads the credentials of the process pinned by pidfd, whose
// pid in this process's /proc is pid: its user namespace from
// /proc/<pid>/ns/user, its effective uid and capabilities from
// /proc/<pid>/status. It confirms afterwards with pidfd_send_signal(pidfd,
// 0) that the pinned process is still there: if it has not been reaped by
// then, the pid could not have been reused in between, so /proc spoke of
// it. They are the credentials as they are now, which the process may have
// changed since whatever the caller relies on (an exec that changed its
// effective uid, say): comparing is the caller's.
func ReadCreds(pidfd, pid int) (Creds, error) {
	if pid <= 0 {
		return Creds{}, fmt.Errorf("%w: pid %d is not one of this process's namespace", ErrProcessGone, pid)
	}
	dir := "/proc/" + strconv.Itoa(pid)
	var st unix.Stat_t
	if err := unix.Stat(dir+"/ns/user", &st); err != nil {
		return Creds{}, goneOr(pid, pathErr("stat", dir+"/ns/user", err))
	}
	status, err := os.ReadFile(dir + "/status")
	if err != nil {
		return Creds{}, goneOr(pid, err)
	}
	c, err := parseStatus(status)
	if err != nil {
		return Creds{}, fmt.Errorf("netns: %s/status: %w", dir, err)
	}
	c.UserNS = ID{Dev: st.Dev, Ino: st.Ino}
	if err := unix.PidfdSendSignal(pidfd, 0, nil, 0); err != nil {
		return Creds{}, goneOr(pid, fmt.Errorf("pidfd_send_signal(0): %w", err))
	}
	return c, nil
}

// goneOr wraps err with ErrProcessGone when it says that the process is
// gone (or was never there), and names pid in either case.
func goneOr(pid int, err error) error {
	if vanished(err) || errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("%w: pid %d: %w", ErrProcessGone, pid, err)
	}
	return fmt.Errorf("netns: pid %d: %w", pid, err)
}

// parseStatus reads the effective uid (Uid's second field) and
// CAP_SYS_ADMIN of CapEff from a /proc/<pid>/status.
func parseStatus(b []byte) (Creds, error) {
	var c Creds
	var gotUID, gotCaps bool
	for line := range bytes.Lines(b) {
		k, v, ok := bytes.Cut(bytes.TrimSpace(line), []byte(":"))
		if !ok {
			continue
		}
		f := bytes.Fields(v)
		switch string(k) {
		case "Uid":
			if len(f) < 2 {
				return c, fmt.Errorf("Uid line %q", line)
			}
			u, err := strconv.ParseUint(string(f[1]), 10, 32)
			if err != nil {
				return c, fmt.Errorf("Uid line %q: %w", line, err)
			}
			c.EUID, gotUID = uint32(u), true
		case "CapEff":
			if len(f) != 1 {
				return c, fmt.Errorf("CapEff line %q", line)
			}
			caps, err := strconv.ParseUint(string(f[0]), 16, 64)
			if err != nil {
				return c, fmt.Errorf("CapEff line %q: %w", line, err)
			}
			c.SysAdmin, gotCaps = caps&(1<<capSysAdmin) != 0, true
		}
	}
	if !gotUID || !gotCaps {
		return c, errors.New("no Uid or CapEff line")
	}
	return c, nil
}

// CheckPassed checks that fd, a descriptor another process opened and
// passed, is a network namespace's, opened for real (not O_PATH), and
// returns its ID. It asks the file's file system nothing first: the file
// is whatever the other process chose (one on a FUSE mount it serves,
// whose stat or statfs it could leave unanswered), so only a statx that
// uses what the kernel holds (AT_STATX_DONT_SYNC) tells it from nsfs, on
// whose files the rest is safe. An error wraps [ErrNotNamespace] for
// anything else.
func CheckPassed(fd int) (ID, error) {
	var nsfs unix.Stat_t
	if err := unix.Stat("/proc/self/ns/net", &nsfs); err != nil {
		return ID{}, fmt.Errorf("netns: %w", pathErr("stat", "/proc/self/ns/net", err))
	}
	var sx unix.Statx_t
	if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH|unix.AT_STATX_DONT_SYNC, unix.STATX_INO, &sx); err != nil {
		return ID{}, fmt.Errorf("netns: descriptor passed: statx: %w", err)
	}
	id := ID{Dev: unix.Mkdev(sx.Dev_major, sx.Dev_minor), Ino: sx.Ino}
	if id.Dev != nsfs.Dev {
		return ID{}, fmt.Errorf("netns: descriptor passed is not a namespace: %w", ErrNotNamespace)
	}
	t, err := unix.IoctlRetInt(fd, unix.NS_GET_NSTYPE)
	switch {
	case errors.Is(err, unix.EBADF):
		return ID{}, fmt.Errorf("netns: descriptor passed is O_PATH, not open: %w", ErrNotNamespace)
	case err != nil:
		return ID{}, fmt.Errorf("netns: descriptor passed: ioctl(NS_GET_NSTYPE): %w", err)
	case t != unix.CLONE_NEWNET:
		return ID{}, fmt.Errorf("netns: descriptor passed is a namespace of another type (%#x): %w", t, ErrNotNamespace)
	}
	return id, nil
}

// maxUserNSDepth bounds the walk up the user namespaces: the kernel nests
// them 32 deep at most.
const maxUserNSDepth = 33

// MayEnter reports whether a process with credentials c holds
// CAP_SYS_ADMIN in the user namespace that owns the namespace open as fd,
// by the kernel's rule (cap_capable): walking up from that user namespace,
// the process holds it if it reaches its own user namespace, with
// CAP_SYS_ADMIN effective there; or, before, one whose parent is the
// process's own and whose owner is its effective uid (the creator of a
// user namespace holds every capability in it and below). Any other way
// up, to the top (this process's user namespace), it does not. That is
// what setns(2) asks of the namespace's side; a process that holds it
// through ownership enters the owning user namespace first, as
// `nsenter --user --net` does. fd is a namespace's descriptor, checked
// (see [CheckPassed], [OpenForeign]).
func MayEnter(fd int, c Creds) (bool, error) {
	ns, err := unix.IoctlRetInt(fd, unix.NS_GET_USERNS)
	if err != nil {
		return false, fmt.Errorf("netns: ioctl(NS_GET_USERNS): %w", err)
	}
	defer func() { unix.Close(ns) }()
	for range maxUserNSDepth {
		id, err := fdID(ns)
		if err != nil {
			return false, err
		}
		if id == c.UserNS {
			return c.SysAdmin, nil
		}
		parent, err := unix.IoctlRetInt(ns, unix.NS_GET_PARENT)
		if errors.Is(err, unix.EPERM) {
			return false, nil // the top: c's user namespace is not above
		}
		if err != nil {
			return false, fmt.Errorf("netns: ioctl(NS_GET_PARENT): %w", err)
		}
		owned, err := ownedFrom(ns, parent, c)
		unix.Close(ns)
		ns = parent
		if err != nil || owned {
			return owned, err
		}
	}
	return false, fmt.Errorf("netns: user namespaces nested deeper than %d", maxUserNSDepth)
}

// ownedFrom reports whether user namespace ns, whose parent is parent, is
// the process's with credentials c by ownership: its parent is c's user
// namespace and its owner c's effective uid.
func ownedFrom(ns, parent int, c Creds) (bool, error) {
	pid, err := fdID(parent)
	if err != nil || pid != c.UserNS {
		return false, err
	}
	uid, err := unix.IoctlGetUint32(ns, unix.NS_GET_OWNER_UID)
	if err != nil {
		return false, fmt.Errorf("netns: ioctl(NS_GET_OWNER_UID): %w", err)
	}
	return uid == c.EUID, nil
}

// fdID is the ID of the namespace open as fd.
func fdID(fd int) (ID, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return ID{}, fmt.Errorf("netns: fstat of a user namespace: %w", err)
	}
	return ID{Dev: st.Dev, Ino: st.Ino}, nil
}
