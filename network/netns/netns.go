package netns

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/network/internal/osthread"
)

// MaxNameLen is the longest name a namespace file may have (NAME_MAX).
const MaxNameLen = 255

// ErrInvalidName is returned (wrapped) for a name that cannot be a netns file
// name: empty, ".", "..", longer than MaxNameLen, or containing '/' or NUL.
var ErrInvalidName = errors.New("invalid netns name")

// ErrNotNamespace is returned (wrapped) when a path in the netns directory is a
// symlink, a directory or something else that this package never touches.
var ErrNotNamespace = errors.New("not a network namespace file")

// BusyError reports a namespace file that could not be removed because the
// kernel kept answering EBUSY (or the context ended while retrying). The file
// is left for a reconciler; nothing was silently dropped.
type BusyError struct {
	// Path is the namespace file.
	Path string
	// Call is the system call that failed ("unlink" or "umount2").
	Call string
	// Attempts is how many times the call was tried.
	Attempts int
	// Err is the last error (EBUSY, or the context's error).
	Err error
}

// Error implements error.
func (e *BusyError) Error() string {
	return fmt.Sprintf("netns: %s %s: %v (after %d attempts)", e.Call, e.Path, e.Err, e.Attempts)
}

// Unwrap returns the underlying error.
func (e *BusyError) Unwrap() error { return e.Err }

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

// PrepareDir makes dir (mode 0755) if needed and turns it into a shared mount
// point the way iproute2 does: under an exclusive flock on the directory, if
// it is not a mount point yet, bind it onto itself recursively, make it
// private (so it leaves its parent's peer group and our mounts do not
// propagate twice) and then shared (so unmounts propagate to other mount
// namespaces). It is idempotent and cheap once the directory is set up.
//
// iproute2 makes the directory shared with MS_REC on every call; once the
// directory is a shared mount, new namespace mounts under it are shared by
// construction, so this function uses a non-recursive MS_SHARED on the fast
// path: the recursive form costs time proportional to the mounts below.
func PrepareDir(dir string) error {
	if !filepath.IsAbs(dir) {
		return fmt.Errorf("netns: directory %q is not absolute", dir)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("netns: prepare dir: %w", err)
	}
	lock, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("netns: prepare dir: %w", pathErr("open", dir, err))
	}
	defer unix.Close(lock)
	// Like iproute2, go on without the lock if flock fails.
	if err := unix.Flock(lock, unix.LOCK_EX); err == nil {
		defer unix.Flock(lock, unix.LOCK_UN) //nolint:errcheck // closing releases it anyway
	}
	made := false
	for {
		err := unix.Mount("", dir, "none", unix.MS_SHARED, "")
		if err == nil {
			return nil
		}
		if !errors.Is(err, unix.EINVAL) || made {
			return fmt.Errorf("netns: prepare dir: mount --make-shared: %w", pathErr("mount", dir, err))
		}
		if err := unix.Mount(dir, dir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("netns: prepare dir: mount --rbind: %w", pathErr("mount", dir, err))
		}
		if err := unix.Mount("", dir, "none", unix.MS_PRIVATE|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("netns: prepare dir: mount --make-rprivate: %w", pathErr("mount", dir, err))
		}
		if err := unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("netns: prepare dir: mount --make-rshared: %w", pathErr("mount", dir, err))
		}
		made = true
	}
}

// Create makes a new network namespace and binds it to dir/name, the way
// `ip netns add` does, and returns the file's path. The directory is
// prepared with PrepareDir. It fails with an error wrapping fs.ErrExist when
// the name already exists (whatever it is). On failure nothing is left
// behind.
//
// The placeholder is made with O_CREAT|O_EXCL|O_NOFOLLOW relative to a
// descriptor of the directory, and the namespace is bind-mounted onto
// /proc/self/fd/N of that placeholder's descriptor, not onto the path: a
// symlink or another file renamed over the name meanwhile cannot redirect
// the mount outside the directory (a mount onto a placeholder that was
// replaced fails, the kernel refusing to mount on an unlinked file). Once
// mounted, the name is checked to show the new namespace.
//
// The namespace is made on a fresh goroutine whose OS thread is locked and
// never unlocked: the thread exits with the goroutine, so no thread that Go
// reuses ever changes namespace. The calling goroutine is not affected.
func Create(ctx context.Context, dir, name string) (string, error) {
	if err := ValidateName(name); err != nil {
		return "", fmt.Errorf("netns: create: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return "", fmt.Errorf("netns: create %s: %w", name, err)
	}
	if err := PrepareDir(dir); err != nil {
		return "", err
	}
	path := filepath.Join(dir, name)
	dirfd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", fmt.Errorf("netns: create: %w", pathErr("open", dir, err))
	}
	defer unix.Close(dirfd)
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", fmt.Errorf("netns: create placeholder: %w", pathErr("open", path, err))
	}
	var placeholder unix.Stat_t
	if err := unix.Fstat(fd, &placeholder); err != nil {
		unix.Close(fd)
		// Unstat-able: leave it for Delete's checks rather than unlink blind.
		return "", errors.Join(fmt.Errorf("netns: create placeholder: %w", pathErr("fstat", path, err)),
			Delete(context.WithoutCancel(ctx), dir, name))
	}

	var c created
	osthread.Throwaway(func() { c = createHere(fdPath(fd), path) })
	unix.Close(fd)
	if c.err == nil {
		c.err = checkBound(path, c.id)
	}
	if c.err != nil {
		return "", errors.Join(c.err, removePlaceholder(dirfd, name, path, placeholder))
	}
	return path, nil
}

// created is what the creating thread reports: the new namespace's ID, or
// why it failed.
type created struct {
	id  ID
	err error
}

// createHere makes a network namespace for the calling thread, which
// must be one of osthread.Throwaway's, and binds it onto target.
func createHere(target, path string) created {
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		return created{err: fmt.Errorf("netns: create %s: unshare(CLONE_NEWNET): %w", path, err)}
	}
	var st unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/net", &st); err != nil {
		return created{err: fmt.Errorf("netns: create %s: %w", path, pathErr("stat", "/proc/thread-self/ns/net", err))}
	}
	if err := unix.Mount("/proc/thread-self/ns/net", target, "none", unix.MS_BIND, ""); err != nil {
		return created{err: fmt.Errorf("netns: create: bind /proc/thread-self/ns/net onto the placeholder: %w", pathErr("mount", path, err))}
	}
	return created{id: ID{Dev: st.Dev, Ino: st.Ino}}
}

// checkBound makes sure the namespace id is what path shows. If it is not,
// the placeholder was moved between its creation and the mount, and the
// mount went with it: it is found by its root in mountinfo and detached, so
// the namespace does not live on at a name nobody knows.
func checkBound(path string, id ID) error {
	got, err := Stat(path)
	if err == nil && got == id {
		return nil
	}
	if err == nil {
		err = fmt.Errorf("%s shows namespace %d, not the new one %d", path, got.Ino, id.Ino)
	}
	err = fmt.Errorf("netns: create: the placeholder moved while the namespace was bound: %w", err)
	if derr := detachByRoot(id); derr != nil {
		return errors.Join(err, derr)
	}
	return err
}

// removePlaceholder unlinks dir/name only if it is still the placeholder
// Create made (same inode, nothing mounted on it): a failed Create never
// removes what someone else put at the name.
func removePlaceholder(dirfd int, name, path string, made unix.Stat_t) error {
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("netns: remove placeholder: %w", pathErr("fstatat", path, err))
	}
	if st.Dev != made.Dev || st.Ino != made.Ino {
		return nil // not ours any more (or something is mounted on it): leave it
	}
	if err := unix.Unlinkat(dirfd, name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("netns: remove placeholder: %w", pathErr("unlink", path, err))
	}
	return nil
}

// Delete removes the namespace file dir/name. It is idempotent: a missing
// file is success. It opens the name with O_PATH|O_NOFOLLOW, inspects that
// descriptor (see Inspect) and detaches exactly the mount it shows
// (MNT_DETACH through /proc/self/fd/N, so a path swapped meanwhile cannot
// redirect the unmount), then unlinks the name, retrying EBUSY (stacked
// mounts) with a bounded exponential backoff (about a second in all, shorter
// if ctx ends). A file that still cannot be removed is reported as a
// *BusyError. A placeholder is unlinked. Anything else — symlinks,
// directories, files with content, mounts of something other than a network
// namespace — is never touched: it gives an error wrapping ErrNotNamespace.
//
// Unlinking has no descriptor-based form: between the detach and the unlink
// (one system call) the name is not re-inspected. Nothing is ever followed,
// so the unlink can only remove an entry of the directory.
//
// Deleting the file does not kill the namespace if a process lives in it or
// holds a descriptor to it: the kernel object, and any veth in it, live on
// until the last reference goes.
func Delete(ctx context.Context, dir, name string) error {
	if err := ValidateName(name); err != nil {
		return fmt.Errorf("netns: delete: %w", err)
	}
	return deletePath(ctx, filepath.Join(dir, name))
}

const (
	deleteAttempts   = 8
	deleteFirstDelay = 2 * time.Millisecond
	deleteMaxDelay   = 250 * time.Millisecond
)

func deletePath(ctx context.Context, path string) error {
	delay := deleteFirstDelay
	for attempt := 1; ; attempt++ {
		fd, err := openPath(path)
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("netns: delete: %w", err)
		}
		state, _, err := inspectFD(fd, path)
		if err == nil && state == Bound {
			if uerr := unix.Unmount(fdPath(fd), unix.MNT_DETACH); uerr != nil && !errors.Is(uerr, unix.EINVAL) {
				err = pathErr("umount2", path, uerr)
			}
		}
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("netns: delete: %w", err)
		}
		err = unix.Unlink(path)
		if err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("netns: delete: %w", pathErr("unlink", path, err))
		}
		// Still a mount point: another namespace was stacked on the
		// same file. Look again (it must be a namespace too) after a
		// pause.
		if attempt >= deleteAttempts {
			return &BusyError{Path: path, Call: "unlink", Attempts: attempt, Err: err}
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return &BusyError{Path: path, Call: "unlink", Attempts: attempt, Err: errors.Join(err, ctx.Err())}
		case <-t.C:
		}
		delay = min(2*delay, deleteMaxDelay)
	}
}

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

// String returns the state's name.
func (s State) String() string {
	switch s {
	case Missing:
		return "missing"
	case Bound:
		return "bound"
	case Placeholder:
		return "placeholder"
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
		return Missing, st, fmt.Errorf("%s is a %s: %w", path, fileType(st.Mode), ErrNotNamespace)
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

func fileType(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFLNK:
		return "symlink"
	case unix.S_IFDIR:
		return "directory"
	}
	return "special file"
}

// Kind says what a directory entry is.
type Kind uint8

// Kinds of directory entries. Only KindFile entries can be namespaces.
const (
	KindFile Kind = iota
	KindSymlink
	KindDir
	KindOther
)

// String returns the kind's name.
func (k Kind) String() string {
	switch k {
	case KindFile:
		return "file"
	case KindSymlink:
		return "symlink"
	case KindDir:
		return "dir"
	}
	return "other"
}

// Entry is one name in a netns directory.
type Entry struct {
	Name string
	Kind Kind
}

// List returns the entries of dir whose names start with prefix, without
// following symlinks. A missing directory is an empty list.
func List(dir, prefix string) ([]Entry, error) {
	f, err := os.Open(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, fmt.Errorf("netns: list: %w", err)
	}
	defer f.Close()
	des, err := f.ReadDir(-1)
	if err != nil {
		return nil, fmt.Errorf("netns: list: %w", err)
	}
	out := make([]Entry, 0, len(des))
	for _, de := range des {
		name := de.Name()
		if !strings.HasPrefix(name, prefix) {
			continue
		}
		k := KindOther
		switch t := de.Type(); {
		case t.IsRegular():
			k = KindFile
		case t&os.ModeSymlink != 0:
			k = KindSymlink
		case t.IsDir():
			k = KindDir
		}
		out = append(out, Entry{Name: name, Kind: k})
	}
	return out, nil
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
