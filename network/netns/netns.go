package netns

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// MaxNameLen is the longest name a namespace file may have (NAME_MAX).
const MaxNameLen = 255

// ErrInvalidName is returned (wrapped) for a name that cannot be a netns file
// name: empty, ".", "..", longer than MaxNameLen, or containing '/' or NUL.
var ErrInvalidName = errors.New("invalid netns name")

// ErrNotNamespace is returned (wrapped) when a path in the netns directory is a
// symlink, a directory or something else that this package never touches.
var ErrNotNamespace = errors.New("not a network namespace file")

// ID identifies a network namespace object: the device and inode of its nsfs
// file. Two paths (a netns file, /proc/<pid>/ns/net) refer to the same
// namespace when their IDs are equal.
type ID struct {
	Dev uint64
	Ino uint64
}

// ValidateName reports whether name can be used as a namespace file name.
func ValidateName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: empty", ErrInvalidName)
	case name == "." || name == "..":
		return fmt.Errorf("%w: %q", ErrInvalidName, name)
	case len(name) > MaxNameLen:
		return fmt.Errorf("%w: %q is longer than %d bytes", ErrInvalidName, name, MaxNameLen)
	case strings.ContainsAny(name, "/\x00"):
		return fmt.Errorf("%w: %q contains '/' or NUL", ErrInvalidName, name)
	}
	return nil
}

func pathErr(op, path string, err error) error {
	return &os.PathError{Op: op, Path: path, Err: err}
}

// PathID returns the identity (device and inode) of what path names, with
// one lstat: a symlink is not followed, a bind mount is (the namespace
// bound there). Unlike Stat it does not check that this is a network
// namespace: it is for matching against the IDs of a process scan, which a
// placeholder, a symlink or a namespace of another type never equals,
// where Stat's descriptor and type check cost six more system calls a slot.
func PathID(path string) (ID, error) {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return ID{}, fmt.Errorf("netns: %w", pathErr("lstat", path, err))
	}
	return ID{Dev: st.Dev, Ino: st.Ino}, nil
}

// Stat returns the ID of the network namespace bound at path, inspected
// through one O_PATH|O_NOFOLLOW descriptor like Inspect. Anything but a bound
// network namespace (a placeholder, a look-alike) gives an error wrapping
// ErrNotNamespace.
func Stat(path string) (ID, error) {
	fd, err := openPath(path)
	if err != nil {
		return ID{}, fmt.Errorf("netns: %w", err)
	}
	defer unix.Close(fd)
	state, st, err := inspectFD(fd, path)
	if err != nil {
		return ID{}, fmt.Errorf("netns: %w", err)
	}
	if state != Bound {
		return ID{}, fmt.Errorf("netns: %s is not mounted: %w", path, ErrNotNamespace)
	}
	return ID{Dev: st.Dev, Ino: st.Ino}, nil
}

// IsMounted reports whether path is a bound network namespace.
func IsMounted(path string) bool {
	_, err := Stat(path)
	return err == nil
}

// Open returns a read-only, close-on-exec descriptor of the network
// namespace bound at path, usable with setns(2) or netlink.NewHandleAt. The
// name is opened once with O_PATH|O_NOFOLLOW, inspected through that
// descriptor, and the namespace is opened through /proc/self/fd/N of it, so
// what is returned is what was inspected, whatever happens to the name
// meanwhile. The caller closes it as soon as it is done.
func Open(path string) (int, error) {
	fd, err := openPath(path)
	if err != nil {
		return -1, fmt.Errorf("netns: %w", err)
	}
	defer unix.Close(fd)
	state, _, err := inspectFD(fd, path)
	if err != nil {
		return -1, fmt.Errorf("netns: %w", err)
	}
	if state != Bound {
		return -1, fmt.Errorf("netns: %s is not mounted: %w", path, ErrNotNamespace)
	}
	nfd, err := unix.Open(fdPath(fd), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("netns: %w", pathErr("open", path, err))
	}
	return nfd, nil
}
