package netns

import (
	"errors"
	"fmt"
	"path/filepath"
	"strconv"

	"github.com/phasegate/phasegate/internal/statmode"
	"golang.org/x/sys/unix"
)

// State is what Inspect found at a path.
type State uint8

// States of a path in a netns directory.
const (
	// Missing: nothing is there.
	Missing State = iota
	// Bound: a network namespace is bound there (an nsfs mount of a
	// network namespace).
	Bound
	// Placeholder: an empty regular file that nothing is mounted on. Create
	// and iproute2 make one (mode 0) before binding, containerd-style code
	// (os.Create, mode 0644) and `touch` + `unshare --net=` too, and a
	// Delete interrupted between its unmount and its unlink leaves one
	// behind, with whatever mode the file had. Whatever its mode, it holds
	// no namespace and is safe to unlink.
	Placeholder
)

// stateNames are the states' names, for errors and logs.
var stateNames = [...]string{Missing: "missing", Bound: "bound", Placeholder: "placeholder"}

// String returns the state's name.
func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

// Inspect says what is at path. It opens path once with
// O_PATH|O_NOFOLLOW|O_CLOEXEC and asks everything of that descriptor
// (fstat, fstatfs, statx for the mount root, the namespace type), so a
// symlink or another file swapped in between two checks cannot be
// half-inspected. Anything that is neither a bound network namespace nor a
// placeholder — a symlink, a directory, a file with content, a mount of
// something else (another file system, or a namespace of another type) —
// gives an error wrapping ErrNotNamespace: it is foreign and must not be
// touched. Any other error means path could not be inspected.
//
// A placeholder's mode is not checked: requiring mode 0 left for ever the
// file of any namespace made with a mode-0644 file (containerd, `touch`)
// whose Delete was killed between unmount and unlink, and no later reclaim
// would remove it. The name (prefix and index, checked by the caller) is
// what says the file is ours; emptiness says it holds nothing.
func Inspect(path string) (State, error) {
	fd, err := openPath(path)
	if errors.Is(err, unix.ENOENT) {
		return Missing, nil
	}
	if err != nil {
		return Missing, err
	}
	defer unix.Close(fd)
	st, _, err := inspectFD(fd, path)
	return st, err
}

// openPath opens path as an O_PATH descriptor of the file itself: a symlink
// in the last component is opened, not followed; a mount on it is crossed,
// as any lookup does.
func openPath(path string) (int, error) {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, pathErr("open", path, err)
	}
	return fd, nil
}

// fdPath is the /proc path of a descriptor of ours: opening or mounting on
// it reaches exactly the file the descriptor refers to.
func fdPath(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }

// inspectFD classifies the file that fd (from openPath) refers to.
func inspectFD(fd int, path string) (State, unix.Stat_t, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return Missing, st, pathErr("fstat", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return Missing, st, fmt.Errorf("%s is a %s: %w", path, statmode.Type(st.Mode), ErrNotNamespace)
	}
	var fs unix.Statfs_t
	if err := unix.Fstatfs(fd, &fs); err != nil {
		return Missing, st, pathErr("fstatfs", path, err)
	}
	if fs.Type == unix.NSFS_MAGIC {
		if err := checkNetType(fd, path); err != nil {
			return Missing, st, err
		}
		return Bound, st, nil
	}
	root, err := mountRoot(fd, path)
	if err != nil {
		return Missing, st, err
	}
	if root {
		return Missing, st, fmt.Errorf("%s is a mount of something else: %w", path, ErrNotNamespace)
	}
	if st.Size != 0 {
		return Missing, st, fmt.Errorf("%s is a file with content (size %d): %w", path, st.Size, ErrNotNamespace)
	}
	return Placeholder, st, nil
}

// checkNetType makes sure the nsfs file fd refers to is a network
// namespace: a mount, UTS or other namespace bound at one of our names is
// someone else's. Kernels before 4.11 lack NS_GET_NSTYPE: there any nsfs
// file passes, as it did before this check existed.
func checkNetType(fd int, path string) error {
	nfd, err := unix.Open(fdPath(fd), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return pathErr("open", path, err)
	}
	defer unix.Close(nfd)
	t, err := unix.IoctlRetInt(nfd, unix.NS_GET_NSTYPE)
	switch {
	case errors.Is(err, unix.ENOTTY) || errors.Is(err, unix.EINVAL):
		return nil
	case err != nil:
		return pathErr("ioctl(NS_GET_NSTYPE)", path, err)
	case t != unix.CLONE_NEWNET:
		return fmt.Errorf("%s is a bound namespace of another type (%#x): %w", path, t, ErrNotNamespace)
	}
	return nil
}

// mountRoot reports whether fd is the root of a mount (statx
// STATX_ATTR_MOUNT_ROOT on the descriptor, Linux 5.8+; before that, a
// device different from the parent directory's, which misses a bind mount
// from the same file system).
func mountRoot(fd int, path string) (bool, error) {
	var stx unix.Statx_t
	err := unix.Statx(fd, "", unix.AT_EMPTY_PATH|unix.AT_STATX_DONT_SYNC, unix.STATX_BASIC_STATS, &stx)
	if err != nil && !errors.Is(err, unix.ENOSYS) {
		return false, pathErr("statx", path, err)
	}
	if err == nil && stx.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT != 0 {
		return stx.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0, nil
	}
	var st, parent unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return false, pathErr("fstat", path, err)
	}
	if err := unix.Stat(filepath.Dir(path), &parent); err != nil {
		return false, pathErr("stat", filepath.Dir(path), err)
	}
	return st.Dev != parent.Dev, nil
}
