// Package netns creates, deletes and lists named network namespaces in a
// directory, exactly the way iproute2's `ip netns add` does, so that
// `ip netns list` and `ip netns exec` see and use what it makes and it can
// delete what `ip netns add` made.
//
// Create mounts the directory the iproute2 way (directory lock, recursive
// self bind mount, made private then shared), makes a mode-0 placeholder with
// O_EXCL and bind-mounts /proc/thread-self/ns/net of a fresh namespace onto it.
// The new namespace is made on a goroutine that locks its OS thread and never
// unlocks it, so the thread dies with the goroutine and no thread Go reuses
// ever changes namespace.
//
// Delete is idempotent and bounded: a missing file is success, the mount is
// detached lazily (MNT_DETACH; EINVAL means "not a mount", which is fine), and
// an unlink that fails with EBUSY is retried under a bounded backoff. What is
// still stuck is returned as a *BusyError so that a reconciler can finish it.
//
// Symlinks and directories in the netns directory are never followed nor
// removed. No file descriptor is kept open longer than one call, and every
// one is opened with O_CLOEXEC.
package netns
