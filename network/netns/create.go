package netns

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/network/internal/osthread"
)

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
