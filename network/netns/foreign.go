package netns

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// OpenForeign returns a read-only, close-on-exec descriptor of the network
// namespace at path, for a namespace phasegate does not own: a container's,
// which its runtime made, names and destroys. Unlike [Open] it follows path
// (a runtime may give a bound file or a /proc/PID/ns/net link, and it is
// the runtime's to name) and does not require a mount there; it checks that
// what it opened is a network namespace (NS_GET_NSTYPE), so that a path to
// anything else is refused with an error wrapping [ErrNotNamespace] before
// a caller acts on it. Who may name which namespace is the caller's to
// decide.
func OpenForeign(path string) (int, error) {
	// O_PATH first: opening a FIFO or a device for reading can block or
	// act; only an nsfs file is then opened for real.
	pfd, err := unix.Open(path, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("netns: %w", pathErr("open", path, err))
	}
	defer unix.Close(pfd)
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(pfd, &sfs); err != nil {
		return -1, fmt.Errorf("netns: %w", pathErr("fstatfs", path, err))
	}
	if sfs.Type != unix.NSFS_MAGIC {
		return -1, fmt.Errorf("netns: %s is not a namespace: %w", path, ErrNotNamespace)
	}
	fd, err := unix.Open(fdPath(pfd), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("netns: %w", pathErr("open", path, err))
	}
	t, err := unix.IoctlRetInt(fd, unix.NS_GET_NSTYPE)
	switch {
	case errors.Is(err, unix.ENOTTY) || errors.Is(err, unix.EINVAL):
		err = fmt.Errorf("netns: %s is not a namespace: %w", path, ErrNotNamespace)
	case err != nil:
		err = fmt.Errorf("netns: %w", pathErr("ioctl(NS_GET_NSTYPE)", path, err))
	case t != unix.CLONE_NEWNET:
		err = fmt.Errorf("netns: %s is a namespace of another type (%#x): %w", path, t, ErrNotNamespace)
	}
	if err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}
