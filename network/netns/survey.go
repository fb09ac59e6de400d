package netns

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/network/internal/procfs"
)

// Found is one entry of a netns directory that Survey looked at.
type Found struct {
	// Name is the entry's name.
	Name string
	// State is Bound or Placeholder when Err is nil.
	State State
	// ID is the identity of the namespace bound there (Bound only), as
	// Stat gives it: read from mountinfo (the mount's root, net:[inode],
	// and its device) at no cost of its own, so that a caller can tell a
	// namespace made again under the name from the one it recorded.
	ID ID
	// Err is nil for a namespace or a placeholder. It wraps
	// ErrNotNamespace for a look-alike (a symlink, a directory, a file
	// with content, a mount of something else), which must never be
	// touched; any other error means the entry could not be inspected.
	Err error
}

// Survey says what each entry of dir whose name match accepts is, by the
// rules of Inspect, at a cost linear in the number of entries: one read of
// the directory, one read of /proc/thread-self/mountinfo to learn which
// entries are mount points and of what, and one fstatat for each entry that
// is not a mount point (a placeholder or a look-alike). Inspecting each
// entry instead costs five system calls, too many for the directory of a
// large pool that every start and reconcile pass scans (the goal:
// docs/BENCHMARKS.md). A missing directory gives no entries.
//
// Like any listing it is a snapshot: a name can change right after it was
// looked at. Delete and Open inspect the name again, through one
// descriptor, before they act, so a stale answer can never make them touch
// a look-alike. If mountinfo cannot be read, each entry is inspected with
// Inspect instead.
func Survey(dir string, match func(name string) bool) ([]Found, error) {
	d, des, err := readDir(dir, "survey")
	if err != nil || d == nil {
		return nil, err
	}
	defer d.Close()
	dirfd := int(d.Fd())
	mounts, mountsErr := mountsIn(dirfd)
	out := make([]Found, 0, len(des))
	for _, de := range des {
		name := de.Name()
		if !match(name) {
			continue
		}
		f := Found{Name: name}
		path := filepath.Join(dir, name)
		switch t := de.Type(); {
		case t&os.ModeSymlink != 0:
			f.Err = fmt.Errorf("%s is a symlink: %w", path, ErrNotNamespace)
		case t.IsDir():
			f.Err = fmt.Errorf("%s is a directory: %w", path, ErrNotNamespace)
		case !t.IsRegular():
			f.Err = fmt.Errorf("%s is a special file: %w", path, ErrNotNamespace)
		case mountsErr != nil:
			if f.State, f.Err = Inspect(path); f.Err == nil && f.State == Bound {
				f.ID, f.Err = Stat(path)
			}
		default:
			if m, ok := mounts[name]; ok {
				f.State, f.Err = m.state(path)
				f.ID = m.id
			} else {
				f.State, f.Err = unmounted(dirfd, name, path)
			}
		}
		if f.Err == nil && f.State == Missing {
			continue // gone since the directory was read
		}
		out = append(out, f)
	}
	return out, nil
}

// unmounted classifies a regular file that mountinfo showed nothing mounted
// on: an empty one is a placeholder. Anything else seen now (the name
// changed since) is inspected in full.
func unmounted(dirfd int, name, path string) (State, error) {
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return Missing, nil
		}
		return Missing, pathErr("fstatat", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return Inspect(path)
	}
	if st.Size != 0 {
		return Missing, fmt.Errorf("%s is a file with content (size %d): %w", path, st.Size, ErrNotNamespace)
	}
	return Placeholder, nil
}

// mount is the mount visible at one name of a directory, and the
// namespace's identity when it is one (zero if not).
type mount struct {
	fstype string
	root   string
	id     ID
}

func (m mount) state(path string) (State, error) {
	if m.fstype == "nsfs" && strings.HasPrefix(m.root, "net:[") {
		return Bound, nil
	}
	if m.fstype == "nsfs" {
		return Missing, fmt.Errorf("%s is a bound namespace of another type (%s): %w", path, m.root, ErrNotNamespace)
	}
	return Missing, fmt.Errorf("%s is a mount of %s: %w", path, m.fstype, ErrNotNamespace)
}

// mountEntry is one line of /proc/<pid>/mountinfo.
type mountEntry struct {
	id, parent int
	dev        string // major:minor
	root       string
	point      string
	fstype     string
}

// mountsIn returns, for each name in the directory dirfd refers to that is
// a mount point, the mount a lookup of the name reaches (the top of a stack
// of mounts on it).
func mountsIn(dirfd int) (map[string]mount, error) {
	dir, err := os.Readlink(fdPath(dirfd))
	if err != nil {
		return nil, err
	}
	base := -1 // the mount the directory is in, if statx can say
	var stx unix.Statx_t
	if unix.Statx(dirfd, "", unix.AT_EMPTY_PATH|unix.AT_STATX_DONT_SYNC, unix.STATX_MNT_ID, &stx) == nil &&
		stx.Mask&unix.STATX_MNT_ID != 0 {
		base = int(stx.Mnt_id)
	}
	b, err := procfs.ReadFile("/proc/thread-self/mountinfo")
	if err != nil {
		return nil, err
	}
	entries, err := parseMountinfo(b)
	if err != nil {
		return nil, err
	}
	return visibleMounts(entries, dir, base), nil
}

// visibleMounts picks, for each name directly under dir, the mount that a
// lookup reaches: starting from a mount whose parent is base (the
// directory's own mount; -1 when unknown: any parent), the one stacked
// last.
func visibleMounts(entries []mountEntry, dir string, base int) map[string]mount {
	prefix := strings.TrimSuffix(dir, "/") + "/"
	byName := map[string][]mountEntry{}
	for _, e := range entries {
		name, ok := strings.CutPrefix(e.point, prefix)
		if !ok || name == "" || strings.Contains(name, "/") {
			continue
		}
		byName[name] = append(byName[name], e)
	}
	out := make(map[string]mount, len(byName))
	for name, es := range byName {
		var top *mountEntry
		for k := range es {
			if base < 0 || es[k].parent == base {
				top = &es[k] // the last one if, oddly, several
			}
		}
		if top == nil {
			continue // hidden under another mount of the directory
		}
		for again := true; again; {
			again = false
			for k := range es {
				if es[k].parent == top.id && es[k].id != top.id {
					top, again = &es[k], true
					break
				}
			}
		}
		out[name] = mount{fstype: top.fstype, root: top.root, id: nsfsID(top.dev, top.root)}
	}
	return out
}

// nsfsID is the identity of the namespace an nsfs mount shows, from its
// device (major:minor) and its root (net:[inode]); zero when they are not
// of that form.
func nsfsID(dev, root string) ID {
	ino, ok := strings.CutPrefix(root, "net:[")
	ino, ok2 := strings.CutSuffix(ino, "]")
	major, minor, ok3 := strings.Cut(dev, ":")
	if !ok || !ok2 || !ok3 {
		return ID{}
	}
	i, err1 := strconv.ParseUint(ino, 10, 64)
	ma, err2 := strconv.ParseUint(major, 10, 32)
	mi, err3 := strconv.ParseUint(minor, 10, 32)
	if err1 != nil || err2 != nil || err3 != nil {
		return ID{}
	}
	return ID{Dev: unix.Mkdev(uint32(ma), uint32(mi)), Ino: i}
}

// parseMountinfo parses the lines of a mountinfo file (proc(5)). Every
// field is a substring of one copy of b: with a pool's 10,000 mounts a
// copy and a []string per line (strings.Fields) were most of the parse.
func parseMountinfo(b []byte) ([]mountEntry, error) {
	text := string(b)
	out := make([]mountEntry, 0, strings.Count(text, "\n"))
	for text != "" {
		line, rest, _ := strings.Cut(text, "\n")
		text = rest
		if line == "" {
			continue
		}
		e, ok := parseMountLine(line)
		if !ok {
			return nil, fmt.Errorf("netns: mountinfo: malformed line %q", line)
		}
		out = append(out, e)
	}
	return out, nil
}

// parseMountLine parses "id parent major:minor root point options
// [optional fields...] - fstype source superoptions".
func parseMountLine(line string) (mountEntry, bool) {
	var f [5]string
	rest := line
	for i := range f {
		var ok bool
		if f[i], rest, ok = nextField(rest); !ok {
			return mountEntry{}, false
		}
	}
	// Options, then optional fields up to the separator "-".
	fstype := ""
	for n := 0; ; n++ {
		field, r, ok := nextField(rest)
		if !ok {
			return mountEntry{}, false
		}
		rest = r
		if n > 0 && field == "-" {
			if fstype, _, ok = nextField(rest); !ok {
				return mountEntry{}, false
			}
			break
		}
	}
	id, err1 := strconv.Atoi(f[0])
	parent, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil {
		return mountEntry{}, false
	}
	return mountEntry{
		id: id, parent: parent, dev: f[2],
		root: unescapeOctal(f[3]), point: unescapeOctal(f[4]), fstype: fstype,
	}, true
}

// nextField returns the first space-separated field of s and what
// follows it; false when s has none.
func nextField(s string) (field, rest string, ok bool) {
	i := 0
	for i < len(s) && (s[i] == ' ' || s[i] == '\t') {
		i++
	}
	if i == len(s) {
		return "", "", false
	}
	j := i
	for j < len(s) && s[j] != ' ' && s[j] != '\t' {
		j++
	}
	return s[i:j], s[min(j+1, len(s)):], true
}

// unescapeOctal undoes the kernel's escaping of space, tab, newline and
// backslash in mountinfo paths (\040, \011, \012, \134).
func unescapeOctal(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) && isOctal(s[i+1]) && isOctal(s[i+2]) && isOctal(s[i+3]) {
			b.WriteByte((s[i+1]-'0')<<6 | (s[i+2]-'0')<<3 | (s[i+3] - '0'))
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isOctal(c byte) bool { return c >= '0' && c <= '7' }

// detachByRoot detaches every mount of the namespace id found in our
// mountinfo (by its root, net:[inode]), wherever it is. Create uses it when
// its placeholder was moved while being bound.
func detachByRoot(id ID) error {
	b, err := procfs.ReadFile("/proc/thread-self/mountinfo")
	if err != nil {
		return fmt.Errorf("netns: find the moved mount: %w", err)
	}
	entries, err := parseMountinfo(b)
	if err != nil {
		return err
	}
	root := "net:[" + strconv.FormatUint(id.Ino, 10) + "]"
	dev := fmt.Sprintf("%d:%d", unix.Major(id.Dev), unix.Minor(id.Dev))
	var errs []error
	for _, e := range entries {
		if e.fstype == "nsfs" && e.root == root && e.dev == dev {
			if err := unix.Unmount(e.point, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil && !errors.Is(err, unix.EINVAL) {
				errs = append(errs, fmt.Errorf("netns: detach the moved mount: %w", pathErr("umount2", e.point, err)))
			}
		}
	}
	return errors.Join(errs...)
}
