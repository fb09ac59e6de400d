package netns

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

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
// the file already exists. On failure nothing is left behind.
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
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return "", fmt.Errorf("netns: create placeholder: %w", pathErr("open", path, err))
	}
	unix.Close(fd)

	errc := make(chan error, 1)
	go createOnOwnThread(path, errc)
	if err := <-errc; err != nil {
		// Nothing was mounted or the mount failed: remove the placeholder.
		if derr := Delete(context.WithoutCancel(ctx), dir, name); derr != nil {
			return "", errors.Join(err, derr)
		}
		return "", err
	}
	return path, nil
}

// createOnOwnThread locks the goroutine to its thread and never unlocks it,
// so the thread, whose network namespace changes, exits with the goroutine.
// The main thread cannot exit (the runtime parks it forever instead): if the
// goroutine landed there, it keeps the main thread busy and does the work on
// a nested goroutine, which then cannot run on the main thread.
func createOnOwnThread(path string, errc chan<- error) {
	runtime.LockOSThread()
	if unix.Gettid() == unix.Getpid() {
		nested := make(chan error, 1)
		go createOnOwnThread(path, nested)
		errc <- <-nested
		runtime.UnlockOSThread() // the main thread never changed namespace
		return
	}
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		errc <- fmt.Errorf("netns: create %s: unshare(CLONE_NEWNET): %w", path, err)
		return
	}
	if err := unix.Mount("/proc/thread-self/ns/net", path, "none", unix.MS_BIND, ""); err != nil {
		errc <- fmt.Errorf("netns: create: bind /proc/thread-self/ns/net: %w", pathErr("mount", path, err))
		return
	}
	errc <- nil
}

// Delete removes the namespace file dir/name. It is idempotent: a missing
// file is success. It detaches the mount (MNT_DETACH, never following a
// symlink; EINVAL means the file is not a mount point), then unlinks the file,
// retrying EBUSY with a bounded exponential backoff (about a second in all,
// shorter if ctx ends). A file that still cannot be removed is reported as a
// *BusyError. A placeholder (see Inspect) is unlinked. Anything else —
// symlinks, directories, files with content, mounts of something other than
// a namespace — is never touched: it gives an error wrapping
// ErrNotNamespace.
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
	state, err := Inspect(path)
	if err != nil {
		return fmt.Errorf("netns: delete: %w", err)
	}
	switch state {
	case Missing:
		return nil
	case Placeholder:
		if err := unix.Unlink(path); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("netns: delete placeholder: %w", pathErr("unlink", path, err))
		}
		return nil
	}
	delay := deleteFirstDelay
	for attempt := 1; ; attempt++ {
		if err := unix.Unmount(path, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil &&
			!errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			if errors.Is(err, unix.EBUSY) {
				// Cannot happen with MNT_DETACH, but treat it like a busy unlink.
				if attempt >= deleteAttempts {
					return &BusyError{Path: path, Call: "umount2", Attempts: attempt, Err: err}
				}
			} else {
				return fmt.Errorf("netns: delete: %w", pathErr("umount2", path, err))
			}
		}
		err := unix.Unlink(path)
		if err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("netns: delete: %w", pathErr("unlink", path, err))
		}
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
		// Something is still mounted there (stacked mounts): unmount it
		// only if it is a namespace too.
		switch state, err := Inspect(path); {
		case err != nil:
			return fmt.Errorf("netns: delete: %w", err)
		case state == Missing:
			return nil
		case state == Placeholder:
			if err := unix.Unlink(path); err != nil && !errors.Is(err, unix.ENOENT) {
				return fmt.Errorf("netns: delete: %w", pathErr("unlink", path, err))
			}
			return nil
		}
	}
}

// State is what Inspect found at a path.
type State uint8

// States of a path in a netns directory.
const (
	// Missing: nothing is there.
	Missing State = iota
	// Bound: a network namespace is bound there (an nsfs mount).
	Bound
	// Placeholder: an empty regular file that nothing is mounted on. Create
	// and iproute2 make one (mode 0) before binding, containerd-style code
	// (os.Create, mode 0644) and `touch` + `unshare --net=` too, and a
	// Delete interrupted between its unmount and its unlink leaves one
	// behind, with whatever mode the file had. Whatever its mode, it holds
	// no namespace and is safe to unlink.
	Placeholder
)

// Inspect says what is at path without following a symlink. Anything that
// is neither a bound namespace nor a placeholder — a symlink, a directory,
// a file with content, a mount of something else — gives an error wrapping
// ErrNotNamespace: it is foreign and must not be touched.
//
// A placeholder's mode is not checked: requiring mode 0 left for ever the
// file of any namespace made with a mode-0644 file (containerd, `touch`)
// whose Delete was killed between unmount and unlink, and no later reclaim
// would remove it. The name (prefix and index, checked by the caller) is
// what says the file is ours; emptiness says it holds nothing.
func Inspect(path string) (State, error) {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return Missing, nil
		}
		return Missing, pathErr("lstat", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return Missing, fmt.Errorf("%s is a %s: %w", path, fileType(st.Mode), ErrNotNamespace)
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(path, &fs); err != nil {
		return Missing, pathErr("statfs", path, err)
	}
	if fs.Type == unix.NSFS_MAGIC {
		return Bound, nil
	}
	if mountRoot(path) {
		return Missing, fmt.Errorf("%s is a mount of something else: %w", path, ErrNotNamespace)
	}
	if st.Size != 0 {
		return Missing, fmt.Errorf("%s is a file with content (size %d): %w", path, st.Size, ErrNotNamespace)
	}
	return Placeholder, nil
}

// mountRoot reports whether path is the root of a mount (statx
// STATX_ATTR_MOUNT_ROOT, Linux 5.8+; before that, a device different from
// the parent directory's).
func mountRoot(path string) bool {
	var stx unix.Statx_t
	err := unix.Statx(unix.AT_FDCWD, path, unix.AT_SYMLINK_NOFOLLOW|unix.AT_STATX_DONT_SYNC, unix.STATX_BASIC_STATS, &stx)
	if err == nil && stx.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT != 0 {
		return stx.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0
	}
	var st, parent unix.Stat_t
	if unix.Lstat(path, &st) != nil || unix.Stat(filepath.Dir(path), &parent) != nil {
		return false
	}
	return st.Dev != parent.Dev
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

// Stat returns the ID of the namespace bound at path. It does not follow a
// symlink at path. A file that is not a bound namespace (a placeholder)
// gives an error wrapping ErrNotNamespace.
func Stat(path string) (ID, error) {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return ID{}, fmt.Errorf("netns: %w", pathErr("lstat", path, err))
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return ID{}, fmt.Errorf("netns: %s: %w", path, ErrNotNamespace)
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(path, &fs); err != nil {
		return ID{}, fmt.Errorf("netns: %w", pathErr("statfs", path, err))
	}
	if fs.Type != unix.NSFS_MAGIC {
		return ID{}, fmt.Errorf("netns: %s is not mounted: %w", path, ErrNotNamespace)
	}
	return ID{Dev: st.Dev, Ino: st.Ino}, nil
}

// IsMounted reports whether path is a bound namespace (a nsfs file).
func IsMounted(path string) bool {
	_, err := Stat(path)
	return err == nil
}

// Open returns a read-only, close-on-exec descriptor of the namespace bound
// at path, usable with setns(2) or netlink.NewHandleAt. The caller closes it
// as soon as it is done.
func Open(path string) (int, error) {
	if _, err := Stat(path); err != nil {
		return -1, err
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return -1, fmt.Errorf("netns: %w", pathErr("open", path, err))
	}
	return fd, nil
}
