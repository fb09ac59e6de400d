// Package netns creates, deletes, inspects and lists named network
// namespaces in a directory, as iproute2's `ip netns add` does.
//
// `ip netns list` and `ip netns exec` see and use what it makes, and it can
// delete what `ip netns add` made.
//
// Create mounts the directory the iproute2 way (directory lock, recursive
// self bind mount, made private then shared), makes a mode-0 placeholder with
// O_EXCL relative to a descriptor of the directory and bind-mounts
// /proc/thread-self/ns/net of a fresh namespace onto /proc/self/fd/N of the
// placeholder's descriptor, so a symlink or file renamed over the name cannot
// redirect the mount. The new namespace is made on a goroutine that locks its
// OS thread and never unlocks it, so the thread dies with the goroutine and
// no thread Go reuses ever changes namespace.
//
// Only two things at one of our names are ours: a bound network namespace
// and an empty regular file (a placeholder). Symlinks, directories, files
// with content and mounts of anything else (another file system, a namespace
// of another type) are look-alikes: never followed, opened, unmounted or
// removed. Inspect, Stat, Open and Delete decide on one
// O_PATH|O_NOFOLLOW|O_CLOEXEC descriptor (fstat, fstatfs, statx for the
// mount root, NS_GET_NSTYPE) and act through /proc/self/fd/N of it, so a
// name swapped between two checks cannot be half-inspected. Survey
// classifies a whole directory by the same rules at a cost linear in its
// entries (one read of mountinfo instead of five system calls per entry).
//
// Delete is idempotent and bounded: a missing file is success, the mount is
// detached lazily (MNT_DETACH), and an unlink that fails with EBUSY (stacked
// mounts) is retried under a bounded backoff after looking again. What is
// still stuck is returned as a *BusyError so that a reconciler can finish it.
// No file descriptor is kept open longer than one call, and every one is
// opened with O_CLOEXEC.
//
// ScanProcesses and ScanHolders read /proc once for the processes that live
// in, or hold a descriptor on, each namespace; what they cannot read is
// returned as an *IncompleteError next to everything they could. KillIn
// signals a process only through a pidfd, after checking through that pidfd
// that it is still in the namespace: a scan is stale by the time it is acted
// on.
//
// For a namespace another process opened and passed, CheckPassed tells a
// network namespace's descriptor from anything else without asking the
// file's file system (one a FUSE server could leave unanswered), and
// MayEnter applies the kernel's capability rule to the credentials
// ReadCreds read of a process pinned by a pidfd: whether that process
// could setns(2) into it itself.
package netns
