package rootdir

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// modeRE is how a refusal names the owner and the mode.
var modeRE = regexp.MustCompile(`: owner (\w+ \()?uid \d+\)?, group .*, mode [0-7]{4};`)

// nobody is the unprivileged user that owns what an attacker made.
const nobody = 65534

// needRoot skips a test that must make directories of another user.
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to make directories of another user")
	}
}

// mkdir makes path with mode (chmod: no umask) and owner uid.
func mkdir(t *testing.T, path string, mode os.FileMode, uid int) {
	t.Helper()
	if err := os.Mkdir(path, 0o700); err != nil {
		t.Fatal(err)
	}
	chown(t, path, uid, mode)
}

func chown(t *testing.T, path string, uid int, mode os.FileMode) {
	t.Helper()
	if err := os.Lchown(path, uid, uid); err != nil {
		t.Fatal(err)
	}
	if mode != 0 {
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
	}
}

func symlink(t *testing.T, target, link string, uid int) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	chown(t, link, uid, 0)
}

func TestCheck(t *testing.T) {
	needRoot(t)
	base := t.TempDir()
	p := func(name string) string { return filepath.Join(base, name) }
	// Each case's directories, made in base before the cases run.
	mkdir(t, p("root0700"), 0o700, 0)
	mkdir(t, p("root0755"), 0o755, 0)
	mkdir(t, p("group0710"), 0o710, 0)
	if err := os.Lchown(p("group0710"), 0, nobody); err != nil {
		t.Fatal(err)
	}
	mkdir(t, p("root0770"), 0o770, 0)
	mkdir(t, p("root0777"), 0o777, 0)
	mkdir(t, p("root1777"), os.ModeSticky|0o777, 0)
	mkdir(t, p("nobody0700"), 0o700, nobody)
	mkdir(t, p("nobody0755"), 0o755, nobody)
	mkdir(t, p("root1777/root0700"), 0o700, 0)
	mkdir(t, p("root0777/root0700"), 0o700, 0)
	mkdir(t, p("nobody0755/root0700"), 0o700, 0)
	symlink(t, p("root0700"), p("rootlink"), 0)
	symlink(t, p("root0755"), p("root1777/nobodylink"), nobody)
	symlink(t, "../root0755", p("root1777/rootrel"), 0)
	if err := os.WriteFile(p("file"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, path string
		why, at    string // "" with why: passes; at: the path refused, when above
	}{
		{"root's 0700", "root0700", "", ""},
		{"root's 0755", "root0755", "", ""},
		{"group search only (the control group)", "group0710", "", ""},
		{"group-writable", "root0770", WhyGroupWritable, ""},
		{"world-writable", "root0777", WhyOthersWritable, ""},
		{"world-writable and sticky, itself", "root1777", WhyOthersWritable, ""},
		{"nobody's", "nobody0700", WhyNotRoot, ""},
		{"a symlink to root's", "rootlink", WhyLink, ""},
		{"a file", "file", WhyNotDir, ""},
		{"missing, in root's", "root0700/new", "", ""},
		{"under a sticky world-writable directory", "root1777/root0700", "", ""},
		{"under a world-writable directory", "root0777/root0700", WhyOthersWritable, "root0777"},
		{"under nobody's directory", "nobody0755/root0700", WhyNotRoot, "nobody0755"},
		{"missing, under nobody's", "nobody0755/new", WhyNotRoot, "nobody0755"},
		{"through root's link", "rootlink/new", "", ""},
		{"through root's relative link in a sticky directory", "root1777/rootrel/new", "", ""},
		{"through nobody's link in a sticky directory", "root1777/nobodylink/new", WhyNotRoot, "root1777/nobodylink"},
		{"under a file", "file/new", WhyNotDir, "file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Check(p(tc.path))
			if tc.why == "" {
				if err != nil {
					t.Fatalf("Check(%s) = %v, want it to pass", tc.path, err)
				}
				return
			}
			var ue *UnsafeError
			if !errors.As(err, &ue) || ue.Why != tc.why {
				t.Fatalf("Check(%s) = %v, want an UnsafeError: %s", tc.path, err, tc.why)
			}
			at := tc.path
			if tc.at != "" {
				at = tc.at
				if ue.Of != p(tc.path) {
					t.Errorf("refusal of %s names %q as the directory asked for", tc.path, ue.Of)
				}
			}
			if ue.Path != p(at) {
				t.Errorf("refusal of %s names %s, want %s", tc.path, ue.Path, p(at))
			}
			// One line: the path, the owner and the mode.
			msg := err.Error()
			if strings.Contains(msg, "\n") || !strings.Contains(msg, p(at)+" ") || !modeRE.MatchString(msg) {
				t.Errorf("message %q does not name the path, the owner and the mode in one line", msg)
			}
		})
	}
}

func TestCheckMessages(t *testing.T) {
	for _, tc := range []struct{ path, want string }{
		{"relative", "must be an absolute path"},
		{"/nonexistent-rootdir/a/b", "parent directory /nonexistent-rootdir does not exist"},
		{"/etc/hostname/x", "/etc/hostname above it is not a directory"},
	} {
		if err := Check(tc.path); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Check(%s) = %v, want %q", tc.path, err, tc.want)
		}
	}
}

// Ensure makes a missing directory 0700 and checks what it opened; an
// existing directory it refuses is left as it was.
func TestEnsure(t *testing.T) {
	needRoot(t)
	base := t.TempDir()
	made := filepath.Join(base, "made")
	d, err := Ensure(made, 0o700)
	if err != nil {
		t.Fatal(err)
	}
	d.Close()
	var st unix.Stat_t
	if err := unix.Lstat(made, &st); err != nil || st.Mode&07777 != 0o700 || st.Uid != 0 {
		t.Fatalf("made %s: mode %o owner %d (%v), want 0700 root's", made, st.Mode&07777, st.Uid, err)
	}
	if d, err := Ensure(made, 0o700); err != nil {
		t.Fatalf("again: %v", err)
	} else {
		d.Close()
	}

	planted := filepath.Join(base, "planted")
	mkdir(t, planted, 0o777, nobody)
	var ue *UnsafeError
	if _, err := Ensure(planted, 0o700); !errors.As(err, &ue) || ue.Why != WhyNotRoot {
		t.Fatalf("Ensure of nobody's 0777 directory = %v, want it refused as not root's", err)
	}
	if err := unix.Lstat(planted, &st); err != nil || st.Mode&07777 != 0o777 || st.Uid != nobody {
		t.Errorf("the refused directory changed: mode %o owner %d", st.Mode&07777, st.Uid)
	}

	// A link made where the directory should be: mkdir finds it there,
	// and the open without following refuses it.
	link := filepath.Join(base, "link")
	symlink(t, made, link, nobody)
	if _, err := Ensure(link, 0o700); !errors.As(err, &ue) || ue.Why != WhyLink || ue.UID != nobody {
		t.Fatalf("Ensure of nobody's link = %v, want it refused as a link of nobody's", err)
	}
	if _, err := Open(link); !errors.As(err, &ue) || ue.Why != WhyLink {
		t.Fatalf("Open of a link = %v, want it refused", err)
	}
}

// A name in a Dir that is a link is refused, whatever the open asks for,
// and what it points to is untouched; both ways of opening refuse it.
func TestOpenFileFollowsNoLink(t *testing.T) {
	base := t.TempDir()
	victim := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(victim, []byte("victim"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, filepath.Join(base, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(base, "nowhere"), filepath.Join(base, "dangling")); err != nil {
		t.Fatal(err)
	}
	d, err := Open(base)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	for _, name := range []string{"link", "dangling"} {
		for _, flag := range []int{os.O_RDONLY, os.O_RDWR | os.O_CREATE | os.O_TRUNC, os.O_WRONLY | os.O_APPEND} {
			f, err := d.OpenFile(name, flag, 0o600)
			var le *LinkError
			if !errors.As(err, &le) || !errors.Is(err, unix.ELOOP) || le.Path != filepath.Join(base, name) {
				if f != nil {
					f.Close()
				}
				t.Errorf("OpenFile(%s, %#x) = %v, want a LinkError naming it", name, flag, err)
			}
		}
		for _, openat2 := range []bool{true, false} {
			if fd, err := openBeneath(d.fd(), name, os.O_RDWR|os.O_CREATE, 0o600, openat2); !errors.Is(err, unix.ELOOP) {
				if err == nil {
					unix.Close(fd)
				}
				t.Errorf("openBeneath(%s, openat2 %v) = %v, want ELOOP", name, openat2, err)
			}
		}
		if _, err := d.Stat(name); !errors.Is(err, unix.ELOOP) {
			t.Errorf("Stat(%s) = %v, want a LinkError", name, err)
		}
	}
	if b, err := os.ReadFile(victim); err != nil || string(b) != "victim" {
		t.Errorf("the link's target changed: %q, %v", b, err)
	}
	if _, err := os.Lstat(filepath.Join(base, "nowhere")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a file was created through the dangling link: %v", err)
	}
	// Remove takes the link away, not its target.
	if err := d.Remove("link"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(victim); err != nil {
		t.Errorf("Remove of the link removed its target: %v", err)
	}
}

func TestDirFiles(t *testing.T) {
	d, err := Ensure(filepath.Join(t.TempDir(), "d"), 0o700)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	for _, name := range []string{"", ".", "..", "a/b", "/etc/passwd"} {
		if _, err := d.OpenFile(name, os.O_RDONLY, 0); !errors.Is(err, fs.ErrInvalid) {
			t.Errorf("OpenFile(%q) = %v, want ErrInvalid: names are one path element", name, err)
		}
	}
	f, err := d.OpenFile("b", os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if f.Name() != d.Join("b") {
		t.Errorf("file named %s, want %s", f.Name(), d.Join("b"))
	}
	f.Close()
	if st, err := d.Stat("b"); err != nil || st.Mode&0o777 != 0o600 {
		t.Errorf("Stat(b) = mode %o, %v; want 0600", st.Mode&0o777, err)
	}
	if err := d.RenameNoReplace("b", "a"); err != nil {
		t.Fatal(err)
	}
	if f, err = d.OpenFile("b", os.O_RDWR|os.O_CREATE, 0o600); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := d.RenameNoReplace("b", "a"); !errors.Is(err, unix.EEXIST) {
		t.Errorf("RenameNoReplace onto an existing name = %v, want EEXIST", err)
	}
	if err := d.Rename("b", "a"); err != nil {
		t.Fatal(err)
	}
	if names, err := d.Names(); err != nil || strings.Join(names, ",") != "a" {
		t.Errorf("Names() = %v, %v; want [a]", names, err)
	}
	if _, err := d.Stat("b"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Stat of a missing name = %v, want ErrNotExist", err)
	}
	if err := d.Sync(); err != nil {
		t.Error(err)
	}
}
