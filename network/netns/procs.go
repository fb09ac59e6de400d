package netns

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Processes maps a namespace ID to the processes that have at least one
// thread inside it.
type Processes map[ID][]int

// ProcError is a process that a /proc scan could not read.
type ProcError struct {
	PID int
	Err error
}

// IncompleteError reports the processes a /proc scan could not read for a
// reason other than their exit while it ran. The Processes returned with it
// are right for every other process: a caller can use them and must treat
// the namespaces it asked about as possibly held by the processes listed.
type IncompleteError struct {
	// Scan is "processes" or "holders".
	Scan string
	// Failed are the processes that could not be read, with the reason.
	Failed []ProcError
}

// Error implements error.
func (e *IncompleteError) Error() string {
	if len(e.Failed) == 0 {
		return "netns: scan " + e.Scan + ": incomplete"
	}
	return fmt.Sprintf("netns: scan %s: %d process(es) could not be read, first pid %d: %v",
		e.Scan, len(e.Failed), e.Failed[0].PID, e.Failed[0].Err)
}

// vanished reports an error that only says the process or thread exited
// while it was being read.
func vanished(err error) bool {
	return errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ESRCH)
}

// ScanProcesses reads /proc once and returns which processes live in which
// network namespace, looking at every thread (a Go program may have moved a
// single locked thread). Processes that exit while being scanned are
// skipped. If /proc cannot be listed, the error says so and the map is nil;
// if some processes cannot be read, the map holds all the others and the
// error is an *IncompleteError naming them.
func ScanProcesses() (Processes, error) {
	return scanProcesses("/proc")
}

func scanProcesses(procRoot string) (Processes, error) {
	return scanProc(procRoot, "processes", func(p procEntry, fail func(error)) []ID {
		return namespacesOf(procRoot+"/"+p.name, p.name, fail)
	})
}

// namespacesOf returns the network namespaces that the threads of the
// process at dir (named name in its /proc) are in. A process or thread
// that exits meanwhile is no error; any other is passed to fail, and the
// namespaces read despite it are returned, except when the leader's own
// could not be read.
func namespacesOf(dir, name string, fail func(error)) []ID {
	seen := map[ID]bool{}
	if id, err := nsOf(dir + "/ns/net"); err == nil {
		seen[id] = true
	} else if !vanished(err) {
		fail(err)
		return nil
	}
	// Threads can be in other namespaces than the leader. Our own
	// process is scanned too: a thread of ours inside would keep a
	// namespace alive just the same.
	tids, err := readNames(dir + "/task")
	if err != nil && !vanished(err) {
		fail(err)
	}
	for _, tid := range tids {
		if tid == name {
			continue
		}
		if id, err := nsOf(dir + "/task/" + tid + "/ns/net"); err == nil {
			seen[id] = true
		} else if !vanished(err) {
			fail(err)
			break
		}
	}
	ids := make([]ID, 0, len(seen))
	for id := range seen {
		ids = append(ids, id)
	}
	return ids
}

// scanProc runs visit on every process of the /proc tree at procRoot and
// maps each namespace visit returns to the process. visit reports with
// fail what it could not read (never a process's exit); those processes
// are named in an *IncompleteError about scan, beside what was found.
func scanProc(procRoot, scan string, visit func(p procEntry, fail func(error)) []ID) (Processes, error) {
	procs, err := listProcesses(procRoot, scan)
	if err != nil {
		return nil, err
	}
	out := make(Processes)
	var failed []ProcError
	for _, p := range procs {
		ids := visit(p, func(err error) {
			failed = append(failed, ProcError{PID: p.pid, Err: err})
		})
		for _, id := range ids {
			out[id] = append(out[id], p.pid)
		}
	}
	if len(failed) > 0 {
		return out, &IncompleteError{Scan: scan, Failed: failed}
	}
	return out, nil
}

// procEntry is a process's directory in a /proc tree.
type procEntry struct {
	pid  int
	name string // the directory's name: the pid in decimal
}

// listProcesses lists the processes of the /proc tree at procRoot: its
// entries named by a positive pid (a thread group; threads are under
// <pid>/task). An error is about the whole scan, which is named in it.
func listProcesses(procRoot, scan string) ([]procEntry, error) {
	names, err := readNames(procRoot)
	if err != nil {
		return nil, fmt.Errorf("netns: scan %s: %w", scan, err)
	}
	out := make([]procEntry, 0, len(names))
	for _, n := range names {
		if pid, err := strconv.Atoi(n); err == nil && pid > 0 {
			out = append(out, procEntry{pid: pid, name: n})
		}
	}
	return out, nil
}

func readNames(dir string) ([]string, error) {
	d, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	return d.Readdirnames(-1)
}

func nsOf(link string) (ID, error) {
	var st unix.Stat_t
	if err := unix.Stat(link, &st); err != nil {
		return ID{}, pathErr("stat", link, err)
	}
	return ID{Dev: st.Dev, Ino: st.Ino}, nil
}

// Comm returns the command name of a process ("" if it is gone).
func Comm(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// KillIn sends SIGKILL to process pid only if it still has a thread in
// the network namespace id, and reports whether it did. A process found by
// an earlier scan may have left the namespace since, or exited and had its
// pid reused by a stranger: neither is signalled (false, nil).
//
// The process is pinned with pidfd_open(2) first, so everything after
// concerns that one process: its namespace is read through the pidfd
// (ioctl PIDFD_GET_NET_NAMESPACE, Linux 6.11+), or else from
// /proc/<pid>/ns/net and its threads' links, confirmed afterwards with
// pidfd_send_signal(pidfd, 0) — if the pinned process has not been reaped
// by then, the pid could not have been reused in between, so /proc spoke
// of it. The signal goes through the pidfd too. Without pidfds (Linux
// before 5.3) nothing is signalled: the error wraps ErrNoPidfd.
func KillIn(pid int, id ID) (bool, error) {
	return killIn(pid, id, true)
}

// ErrNoPidfd is wrapped by KillIn's error on a kernel without pidfd_open.
var ErrNoPidfd = errors.New("netns: pidfd_open is not supported: cannot signal a process safely")

func killIn(pid int, id ID, useIoctl bool) (bool, error) {
	if pid <= 0 {
		return false, fmt.Errorf("netns: kill: invalid pid %d", pid)
	}
	pidfd, err := unix.PidfdOpen(pid, 0)
	switch {
	case errors.Is(err, unix.ESRCH):
		return false, nil
	case errors.Is(err, unix.ENOSYS):
		return false, fmt.Errorf("netns: kill %d: %w", pid, ErrNoPidfd)
	case err != nil:
		return false, fmt.Errorf("netns: kill %d: pidfd_open: %w", pid, err)
	}
	defer unix.Close(pidfd)
	in, err := inNamespace(pidfd, pid, id, useIoctl)
	if err != nil || !in {
		return false, err
	}
	if err := unix.PidfdSendSignal(pidfd, unix.SIGKILL, nil, 0); err != nil {
		if errors.Is(err, unix.ESRCH) {
			return false, nil
		}
		return false, fmt.Errorf("netns: kill %d: pidfd_send_signal: %w", pid, err)
	}
	return true, nil
}

// inNamespace reports whether the process pinned by pidfd has a thread in
// namespace id.
func inNamespace(pidfd, pid int, id ID, useIoctl bool) (bool, error) {
	if useIoctl {
		nsfd, err := unix.IoctlRetInt(pidfd, unix.PIDFD_GET_NET_NAMESPACE)
		switch {
		case err == nil:
			var st unix.Stat_t
			serr := unix.Fstat(nsfd, &st)
			unix.Close(nsfd)
			if serr != nil {
				return false, fmt.Errorf("netns: kill %d: fstat of its namespace: %w", pid, serr)
			}
			if (ID{Dev: st.Dev, Ino: st.Ino}) == id {
				return true, nil
			}
			// The leader is elsewhere; a thread may still be inside.
		case errors.Is(err, unix.ESRCH):
			return false, nil
		case errors.Is(err, unix.ENOTTY) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP):
			// Before Linux 6.11: read /proc, below.
		default:
			return false, fmt.Errorf("netns: kill %d: ioctl(PIDFD_GET_NET_NAMESPACE): %w", pid, err)
		}
	}
	in, err := procInNamespace(pid, id)
	if err != nil {
		return false, fmt.Errorf("netns: kill %d: %w", pid, err)
	}
	// Still the same process? Then /proc/<pid> was about it.
	if err := unix.PidfdSendSignal(pidfd, 0, nil, 0); err != nil {
		if errors.Is(err, unix.ESRCH) {
			return false, nil
		}
		return false, fmt.Errorf("netns: kill %d: pidfd_send_signal(0): %w", pid, err)
	}
	return in, nil
}

// procInNamespace reads /proc/<pid>/ns/net and the links of its threads.
func procInNamespace(pid int, id ID) (bool, error) {
	dir := "/proc/" + strconv.Itoa(pid)
	if got, err := nsOf(dir + "/ns/net"); err == nil && got == id {
		return true, nil
	} else if err != nil && !vanished(err) {
		return false, err
	}
	tids, err := readNames(dir + "/task")
	if err != nil {
		if vanished(err) {
			return false, nil
		}
		return false, err
	}
	for _, tid := range tids {
		got, err := nsOf(dir + "/task/" + tid + "/ns/net")
		if err == nil && got == id {
			return true, nil
		}
		if err != nil && !vanished(err) {
			return false, err
		}
	}
	return false, nil
}

// ScanHolders reads /proc once and returns which processes hold a
// descriptor on which network namespace (a namespace file they opened, as
// the descriptor leaked in hashicorp/nomad PR #25714 was). Such a process
// keeps the namespace, and the veth in it, alive after its file is deleted,
// without living in it. Errors are reported as by ScanProcesses.
func ScanHolders() (Processes, error) {
	return scanHolders("/proc")
}

func scanHolders(procRoot string) (Processes, error) {
	return scanProc(procRoot, "holders", func(p procEntry, fail func(error)) []ID {
		return heldBy(procRoot+"/"+p.name+"/fd/", fail)
	})
}

// heldBy returns the network namespaces that the descriptors in fdDir (a
// process's /proc/<pid>/fd/) refer to, each once. A process that exits
// meanwhile holds nothing, and a descriptor closed meanwhile is no error;
// a directory that cannot be read is passed to fail.
func heldBy(fdDir string, fail func(error)) []ID {
	fds, err := readNames(fdDir)
	if err != nil {
		if !vanished(err) {
			fail(err)
		}
		return nil
	}
	var ids []ID
	var seen map[ID]bool
	for _, f := range fds {
		// A descriptor closed while we look is not an error.
		target, err := os.Readlink(fdDir + f)
		if err != nil || !strings.HasPrefix(target, "net:[") && !strings.HasPrefix(target, "/") {
			continue
		}
		// A namespace opened through its bind mount reads as the
		// file's path; one opened through /proc as net:[inode].
		id, err := nsOf(fdDir + f)
		if err != nil || (!strings.HasPrefix(target, "net:[") && !isNsfs(fdDir+f)) {
			continue
		}
		if seen == nil {
			seen = map[ID]bool{}
		}
		if !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	return ids
}

func isNsfs(path string) bool {
	var fs unix.Statfs_t
	return unix.Statfs(path, &fs) == nil && fs.Type == unix.NSFS_MAGIC
}
