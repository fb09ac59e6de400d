package rootdir

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// LinkError refuses a name in a [Dir] that is a symbolic link: it is not
// followed. It matches unix.ELOOP, what the kernel's no-follow open says.
type LinkError struct {
	// Path is the link.
	Path string
}

func (e *LinkError) Error() string {
	return e.Path + " is a symlink: not followed (remove it, or put the file itself there)"
}

// Unwrap makes the error match unix.ELOOP.
func (e *LinkError) Unwrap() error { return unix.ELOOP }

// Dir is an open directory that passed the rule. Its names are single path
// components, opened relative to its descriptor and never through a link.
type Dir struct {
	f *os.File
}

// Open opens the existing directory at path and applies the rule to every
// directory above it and to the descriptor opened: an *[UnsafeError]
// refuses it.
func Open(path string) (*Dir, error) {
	path, err := clean(path)
	if err != nil {
		return nil, err
	}
	if _, _, _, err := walk(path); err != nil {
		return nil, err
	}
	return openChecked(path)
}

// Ensure is [Open], making the directory first, with perm, when it does
// not exist. Making it is race-free: whatever is at path after the mkdir
// (the one made, or one another process made first) is opened without
// following a link and checked by its descriptor.
func Ensure(path string, perm fs.FileMode) (*Dir, error) {
	path, err := clean(path)
	if err != nil {
		return nil, err
	}
	if _, _, _, err := walk(path); err != nil {
		return nil, err
	}
	if err := unix.Mkdir(path, uint32(perm.Perm())); err != nil && !errors.Is(err, unix.EEXIST) {
		return nil, &fs.PathError{Op: "mkdir", Path: path, Err: err}
	}
	return openChecked(path)
}

// openChecked opens path without following a link in its last element
// and checks the descriptor.
func openChecked(path string) (*Dir, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		// A link (ELOOP) or a file (ENOTDIR): say which, with its owner.
		var st unix.Stat_t
		if lerr := unix.Lstat(path, &st); lerr == nil {
			if rerr := refuse(path, "", &st, false); rerr != nil {
				return nil, rerr
			}
		}
		return nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	d := &Dir{f: os.NewFile(uintptr(fd), path)}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		d.Close()
		return nil, &fs.PathError{Op: "fstat", Path: path, Err: err}
	}
	if err := refuse(path, "", &st, false); err != nil {
		d.Close()
		return nil, err
	}
	return d, nil
}

// Path is the directory's path, as it was opened.
func (d *Dir) Path() string { return d.f.Name() }

// Join is the path of name in the directory, for messages.
func (d *Dir) Join(name string) string { return filepath.Join(d.f.Name(), name) }

// File is the directory's descriptor (to change its owner or mode, to
// bind a socket through /proc/self/fd). The Dir still owns it.
func (d *Dir) File() *os.File { return d.f }

// Close closes the descriptor.
func (d *Dir) Close() error { return d.f.Close() }

// fd is the descriptor's number.
func (d *Dir) fd() int { return int(d.f.Fd()) }

// component refuses a name that is not one path element of the directory.
func (d *Dir) component(op, name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsRune(name, '/') {
		return &fs.PathError{Op: op, Path: d.Join(name), Err: fs.ErrInvalid}
	}
	return nil
}

// OpenFile opens name in the directory with flag and perm (for a file it
// creates), never through a link: a link is a *[LinkError]. The file is
// named by its path in the directory.
func (d *Dir) OpenFile(name string, flag int, perm fs.FileMode) (*os.File, error) {
	if err := d.component("open", name); err != nil {
		return nil, err
	}
	fd, err := openBeneath(d.fd(), name, flag, uint32(perm.Perm()), true)
	if err != nil {
		if errors.Is(err, unix.ELOOP) {
			return nil, &LinkError{Path: d.Join(name)}
		}
		return nil, &fs.PathError{Op: "open", Path: d.Join(name), Err: err}
	}
	return os.NewFile(uintptr(fd), d.Join(name)), nil
}

// openBeneath opens name relative to dirfd without following any link:
// openat2 with RESOLVE_NO_SYMLINKS|RESOLVE_BENEATH, or, on a kernel
// without it (or when tryOpenat2 is false), openat with O_NOFOLLOW, which
// for one path element guarantees the same. O_CLOEXEC is always set.
func openBeneath(dirfd int, name string, flag int, perm uint32, tryOpenat2 bool) (int, error) {
	flag |= unix.O_NOFOLLOW | unix.O_CLOEXEC
	if tryOpenat2 {
		how := unix.OpenHow{Flags: uint64(flag), Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_BENEATH}
		if flag&(unix.O_CREAT|unix.O_TMPFILE) != 0 {
			how.Mode = uint64(perm)
		}
		fd, err := unix.Openat2(dirfd, name, &how)
		// ENOSYS: no openat2 (Linux before 5.6); EPERM: a seccomp filter
		// that does not know it. The fallback tells a real EPERM again.
		if !errors.Is(err, unix.ENOSYS) && !errors.Is(err, unix.EPERM) {
			return fd, err
		}
	}
	return unix.Openat(dirfd, name, flag, perm)
}

// Stat returns name's metadata without following a link: a link is a
// *[LinkError]; a missing name matches fs.ErrNotExist.
func (d *Dir) Stat(name string) (unix.Stat_t, error) {
	var st unix.Stat_t
	if err := d.component("stat", name); err != nil {
		return st, err
	}
	if err := unix.Fstatat(d.fd(), name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return st, &fs.PathError{Op: "stat", Path: d.Join(name), Err: err}
	}
	if isType(&st, unix.S_IFLNK) {
		return st, &LinkError{Path: d.Join(name)}
	}
	return st, nil
}

// Remove unlinks name (a link itself, never what it points to); a missing
// name matches fs.ErrNotExist.
func (d *Dir) Remove(name string) error {
	if err := d.component("remove", name); err != nil {
		return err
	}
	if err := unix.Unlinkat(d.fd(), name, 0); err != nil {
		return &fs.PathError{Op: "remove", Path: d.Join(name), Err: err}
	}
	return nil
}

// Rename renames from to to in the directory, replacing to.
func (d *Dir) Rename(from, to string) error {
	return d.rename(from, to, 0)
}

// RenameNoReplace renames from to to in the directory, failing (EEXIST)
// when to exists.
func (d *Dir) RenameNoReplace(from, to string) error {
	return d.rename(from, to, unix.RENAME_NOREPLACE)
}

func (d *Dir) rename(from, to string, flags uint) error {
	if err := errors.Join(d.component("rename", from), d.component("rename", to)); err != nil {
		return err
	}
	if err := unix.Renameat2(d.fd(), from, d.fd(), to, flags); err != nil {
		return fmt.Errorf("rename %s to %s: %w", d.Join(from), d.Join(to), err)
	}
	return nil
}

// Names lists the directory's entries, sorted.
func (d *Dir) Names() ([]string, error) {
	// A descriptor of its own: reading moves the offset of the one read.
	fd, err := unix.Openat(d.fd(), ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: d.Path(), Err: err}
	}
	f := os.NewFile(uintptr(fd), d.Path())
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", d.Path(), err)
	}
	slices.Sort(names)
	return names, nil
}

// Sync makes the directory's entries durable (fsync).
func (d *Dir) Sync() error {
	if err := d.f.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", d.Path(), err)
	}
	return nil
}

// Statfs describes the directory's file system.
func (d *Dir) Statfs() (unix.Statfs_t, error) {
	var st unix.Statfs_t
	if err := unix.Fstatfs(d.fd(), &st); err != nil {
		return st, &fs.PathError{Op: "statfs", Path: d.Path(), Err: err}
	}
	return st, nil
}
