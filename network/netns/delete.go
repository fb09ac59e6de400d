package netns

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

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
