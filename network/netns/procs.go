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

// ScanProcesses reads /proc once and returns which processes live in which
// network namespace, looking at every thread (a Go program may have moved a
// single locked thread). Processes that vanish or cannot be read while
// scanning are skipped.
func ScanProcesses() (Processes, error) {
	return scanProcesses("/proc")
}

func scanProcesses(procRoot string) (Processes, error) {
	d, err := os.Open(procRoot)
	if err != nil {
		return nil, fmt.Errorf("netns: scan processes: %w", err)
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return nil, fmt.Errorf("netns: scan processes: %w", err)
	}
	out := make(Processes)
	for _, n := range names {
		pid, err := strconv.Atoi(n)
		if err != nil || pid <= 0 {
			continue
		}
		seen := map[ID]bool{}
		if id, ok := nsOf(procRoot + "/" + n + "/ns/net"); ok {
			seen[id] = true
		}
		// Threads can be in other namespaces than the leader. Our own
		// process is scanned too: a thread of ours inside would keep a
		// namespace alive just the same.
		if td, err := os.Open(procRoot + "/" + n + "/task"); err == nil {
			tids, _ := td.Readdirnames(-1)
			td.Close()
			for _, tid := range tids {
				if tid == n {
					continue
				}
				if id, ok := nsOf(procRoot + "/" + n + "/task/" + tid + "/ns/net"); ok {
					seen[id] = true
				}
			}
		}
		for id := range seen {
			out[id] = append(out[id], pid)
		}
	}
	return out, nil
}

func nsOf(link string) (ID, bool) {
	var st unix.Stat_t
	if err := unix.Stat(link, &st); err != nil {
		return ID{}, false
	}
	return ID{Dev: st.Dev, Ino: st.Ino}, true
}

// Comm returns the command name of a process ("" if it is gone).
func Comm(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// Kill sends SIGKILL to pid. A process that is already gone is not an error.
func Kill(pid int) error {
	if err := unix.Kill(pid, unix.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("netns: kill %d: %w", pid, err)
	}
	return nil
}

// ScanHolders reads /proc once and returns which processes hold a
// descriptor on which network namespace (a namespace file they opened, as
// the Nomad seed's leaked descriptor did). Such a process keeps the
// namespace, and the veth in it, alive after its file is deleted, without
// living in it.
func ScanHolders() (Processes, error) {
	return scanHolders("/proc")
}

func scanHolders(procRoot string) (Processes, error) {
	d, err := os.Open(procRoot)
	if err != nil {
		return nil, fmt.Errorf("netns: scan holders: %w", err)
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return nil, fmt.Errorf("netns: scan holders: %w", err)
	}
	out := make(Processes)
	for _, n := range names {
		pid, err := strconv.Atoi(n)
		if err != nil || pid <= 0 {
			continue
		}
		fdDir := procRoot + "/" + n + "/fd/"
		fd, err := os.Open(fdDir)
		if err != nil {
			continue
		}
		fds, _ := fd.Readdirnames(-1)
		fd.Close()
		var seen map[ID]bool
		for _, f := range fds {
			target, err := os.Readlink(fdDir + f)
			if err != nil || !strings.HasPrefix(target, "net:[") && !strings.HasPrefix(target, "/") {
				continue
			}
			// A namespace opened through its bind mount reads as the
			// file's path; one opened through /proc as net:[inode].
			id, ok := nsOf(fdDir + f)
			if !ok || (!strings.HasPrefix(target, "net:[") && !isNsfs(fdDir+f)) {
				continue
			}
			if seen == nil {
				seen = map[ID]bool{}
			}
			if !seen[id] {
				seen[id] = true
				out[id] = append(out[id], pid)
			}
		}
	}
	return out, nil
}

func isNsfs(path string) bool {
	var fs unix.Statfs_t
	return unix.Statfs(path, &fs) == nil && fs.Type == unix.NSFS_MAGIC
}
