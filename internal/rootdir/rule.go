package rootdir

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Why a directory is refused: [UnsafeError.Why].
const (
	WhyNotRoot        = "not root's"
	WhyGroupWritable  = "writable by its group"
	WhyOthersWritable = "writable by others"
	WhyLink           = "a symlink"
	WhyNotDir         = "not a directory"
)

// UnsafeError refuses a directory that a user other than root could
// change, or a path that is not a directory at all. It names the path,
// the owner and the mode, in one line.
type UnsafeError struct {
	// Path is what is refused: the directory asked for, or one above it.
	Path string
	// Of is the directory asked for when Path is above it, else "".
	Of string
	// Why is one of the Why constants.
	Why string
	// UID, GID and Mode (st_mode: type and permission bits) are Path's.
	UID, GID, Mode uint32
}

func (e *UnsafeError) Error() string {
	where := e.Path
	if e.Of != "" {
		where = e.Of + ": " + e.Path + " above it"
	}
	var fix string
	switch e.Why {
	case WhyLink:
		fix = "the daemon follows no link to its own directories: give the real path"
	case WhyNotDir:
		fix = "give a directory"
	default:
		fix = "the daemon's directories, and every one above them, must be root's and writable by no one else (chown root, chmod go-w; a sticky directory above is fine), or give another path"
	}
	return fmt.Sprintf("%s is %s: owner %s, group %s, mode %04o; %s",
		where, e.Why, describe("uid", e.UID, user.LookupId), describe("gid", e.GID, groupName), e.Mode&07777, fix)
}

// describe is "name (uid N)", or "uid N" when the id has no name.
func describe(kind string, id uint32, lookup func(string) (*user.User, error)) string {
	s := strconv.FormatUint(uint64(id), 10)
	if u, err := lookup(s); err == nil && u.Username != "" {
		return u.Username + " (" + kind + " " + s + ")"
	}
	return kind + " " + s
}

// groupName looks a group up as a *user.User, for describe.
func groupName(gid string) (*user.User, error) {
	g, err := user.LookupGroupId(gid)
	if err != nil {
		return nil, err
	}
	return &user.User{Username: g.Name}, nil
}

// maxLinks bounds the links followed above a directory, as the kernel's
// own path resolution does.
const maxLinks = 40

// owned reports whether uid may own the daemon's directories: root, or
// the process's own user when it is not root.
func owned(uid uint32) bool {
	return uid == 0 || int(uid) == os.Geteuid()
}

// isType reports whether st is of type t (unix.S_IFDIR, ...).
func isType(st *unix.Stat_t, t uint32) bool { return st.Mode&unix.S_IFMT == t }

// refuse returns the refusal of st at path (of the directory of, when it
// is above it), or nil when it passes: as the directory itself (above
// false) or as one above it, where the sticky bit makes a writable
// directory safe.
func refuse(path, of string, st *unix.Stat_t, above bool) error {
	why := ""
	switch {
	case isType(st, unix.S_IFLNK):
		why = WhyLink
	case !isType(st, unix.S_IFDIR):
		why = WhyNotDir
	case !owned(st.Uid):
		why = WhyNotRoot
	case above && st.Mode&unix.S_ISVTX != 0:
	case st.Mode&0o002 != 0:
		why = WhyOthersWritable
	case st.Mode&0o020 != 0:
		why = WhyGroupWritable
	}
	if why == "" {
		return nil
	}
	return &UnsafeError{Path: path, Of: of, Why: why, UID: st.Uid, GID: st.Gid, Mode: st.Mode}
}

// walk checks every directory above path (absolute and clean) against the
// rule, following links root owns, and returns the directory path's last
// element is in, with every link resolved, and path's own lstat; ok is
// false when path does not exist (its parent does).
func walk(path string) (parent string, st unix.Stat_t, ok bool, err error) {
	if err := unix.Lstat("/", &st); err != nil {
		return "", st, false, &fs.PathError{Op: "lstat", Path: "/", Err: err}
	}
	if path == "/" {
		return "/", st, true, nil
	}
	if err := refuse("/", path, &st, true); err != nil {
		return "", st, false, err
	}
	todo := strings.Split(path[1:], "/")
	cur, links := "/", 0
	for len(todo) > 1 {
		name := todo[0]
		todo = todo[1:]
		switch name {
		case "", ".":
			continue
		case "..":
			cur = filepath.Dir(cur)
			continue
		}
		next := filepath.Join(cur, name)
		if err := unix.Lstat(next, &st); errors.Is(err, unix.ENOENT) {
			return "", st, false, fmt.Errorf("%s: parent directory %s does not exist", path, next)
		} else if err != nil {
			return "", st, false, &fs.PathError{Op: "lstat", Path: next, Err: err}
		}
		if isType(&st, unix.S_IFLNK) {
			// A link above is followed only when root made it: in a
			// sticky directory another user's link could point anywhere.
			if !owned(st.Uid) {
				return "", st, false, &UnsafeError{Path: next, Of: path, Why: WhyNotRoot, UID: st.Uid, GID: st.Gid, Mode: st.Mode}
			}
			if links++; links > maxLinks {
				return "", st, false, &fs.PathError{Op: "resolve", Path: path, Err: unix.ELOOP}
			}
			target, err := os.Readlink(next)
			if err != nil {
				return "", st, false, err
			}
			if filepath.IsAbs(target) {
				cur = "/"
			}
			todo = append(strings.Split(target, "/"), todo...)
			continue
		}
		if err := refuse(next, path, &st, true); err != nil {
			return "", st, false, err
		}
		cur = next
	}
	err = unix.Lstat(filepath.Join(cur, todo[0]), &st)
	switch {
	case errors.Is(err, unix.ENOENT):
		return cur, st, false, nil
	case err != nil:
		return "", st, false, &fs.PathError{Op: "lstat", Path: path, Err: err}
	}
	return cur, st, true, nil
}

// clean checks that path is absolute and returns it cleaned.
func clean(path string) (string, error) {
	if !filepath.IsAbs(path) {
		return "", fmt.Errorf("%s: must be an absolute path", path)
	}
	return filepath.Clean(path), nil
}

// Check applies the rule to path and every directory above it without
// creating or changing anything: an *[UnsafeError] says what fails. A
// path that does not exist passes when its parent does and passes ([Ensure]
// makes it).
func Check(path string) error {
	path, err := clean(path)
	if err != nil {
		return err
	}
	_, st, ok, err := walk(path)
	if err != nil || !ok {
		return err
	}
	return refuse(path, "", &st, false)
}
