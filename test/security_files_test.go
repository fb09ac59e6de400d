package test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
	"github.com/phasegate/phasegate/app"
	"github.com/phasegate/phasegate/phases/lockfile"
)

// The attacks on the daemon's files (docs/SECURITY.md, "Files only root
// controls"), made as nobody: a state directory, a lock directory or a
// control socket's directory someone else made or can write is refused
// before anything is made in it or through it; a link in a directory of
// root's is refused, not followed; the locks of the world-writable
// /run/lock stop no start.

// holdEnv makes this test binary, run as another user, take and hold
// flocks: "PATH,PATH,…", each made (with its directory) if missing. It
// prints "held" once it holds them all and keeps them until its stdin
// closes.
const holdEnv = "PHASEGATE_TEST_HOLD"

func init() {
	if v := os.Getenv(holdEnv); v != "" {
		os.Exit(hold(strings.Split(v, ",")))
	}
}

func hold(paths []string) int {
	for _, p := range paths {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			fmt.Println(err)
			return 1
		}
		f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o644)
		if err == nil {
			err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		}
		if err != nil {
			fmt.Println(p, err)
			return 1
		}
	}
	fmt.Println("held")
	_, _ = io.Copy(io.Discard, os.Stdin)
	return 0
}

// asUser runs a shell script as user (in group, when set): the attacker's
// preparations.
func asUser(t *testing.T, user, group, script string, args ...string) {
	t.Helper()
	ra := []string{"-u", user}
	if group != "" {
		ra = append(ra, "-g", group)
	}
	out, err := exec.Command("runuser", append(append(ra, "--", "sh", "-ec", script, "sh"), args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("as %s: %s: %v\n%s", user, script, err, out)
	}
}

// arena is a directory every user may write and nobody may rename in
// (root's, 1777, as /tmp and /run/lock are), in a directory every user may
// reach: where an unprivileged user can make a name first.
func arena(t *testing.T, pub *publicDir) string {
	t.Helper()
	dir := filepath.Join(pub.dir, "arena")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, os.ModeSticky|0o777); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// fileState is what a file an attack aims at must keep: its content, mode
// and modification time; or that it does not exist.
type fileState struct {
	exists  bool
	content string
	mode    os.FileMode
	mtime   time.Time
}

func stateOf(t *testing.T, path string) fileState {
	t.Helper()
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return fileState{}
	}
	if err != nil {
		t.Fatal(err)
	}
	s := fileState{exists: true, mode: fi.Mode(), mtime: fi.ModTime()}
	switch {
	case fi.Mode()&os.ModeSymlink != 0:
		s.content, err = os.Readlink(path)
	case fi.Mode().IsRegular():
		var b []byte
		b, err = os.ReadFile(path)
		s.content = string(b)
	}
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// snapshot is the state of every entry of dirs and of files.
func snapshot(t *testing.T, dirs []string, files ...string) map[string]fileState {
	t.Helper()
	m := map[string]fileState{}
	for _, d := range dirs {
		ents, _ := os.ReadDir(d)
		for _, e := range ents {
			files = append(files, filepath.Join(d, e.Name()))
		}
	}
	for _, f := range files {
		m[f] = stateOf(t, f)
	}
	return m
}

func sameSnapshot(t *testing.T, what string, before, after map[string]fileState) {
	t.Helper()
	for p, b := range before {
		if a := after[p]; a != b {
			t.Errorf("%s: %s changed: before %+v, after %+v", what, p, b, a)
		}
	}
	for p, a := range after {
		if _, ok := before[p]; !ok {
			t.Errorf("%s: %s was made: %+v", what, p, a)
		}
	}
}

// refusedAtValidate checks that a daemon exited 2 with one line naming
// each of want (the path, its owner, its mode), and that it made nothing
// of its own: no netns directory, no state directory, no slots lock.
func refusedAtValidate(t *testing.T, d *daemon, h *host, want ...string) {
	t.Helper()
	if code := d.wait(time.Minute); code != 2 {
		t.Fatalf("exit %d, want 2; output:\n%s", code, d.Output())
	}
	out := lines(d.Output())
	if len(out) != 1 {
		t.Fatalf("output %q, want one line", out)
	}
	for _, w := range want {
		if !strings.Contains(out[0], w) {
			t.Errorf("the line %q does not name %q", out[0], w)
		}
	}
	for _, dir := range []string{h.stateDir, h.netnsDir} {
		if _, err := os.Lstat(dir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s was made", dir)
		}
	}
	if lock, err := lockfile.SlotsPath(lockfile.DefaultDir, h.netnsDir, h.prefix); err != nil {
		t.Fatal(err)
	} else if _, err := os.Lstat(lock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the slots lock %s was made", lock)
	}
}

// TestStateDirPlantedByAnotherUser: nobody makes the state directory
// before the daemon (or finds one root made writable), and plants links
// named slots.db, slots.db.journal and control.sock to a file of root's it
// cannot read and to places of its own. The daemon exits 2 with one line
// naming the directory, its owner and its mode; nothing is made through
// the links, the files they point to are unchanged, the directory is as
// nobody left it.
func TestStateDirPlantedByAnotherUser(t *testing.T) {
	pub := newPublicDir(t)
	area := arena(t, pub)
	secret := filepath.Join(pub.dir, "root-secret")
	if err := os.WriteFile(secret, []byte("root's own file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// loot is nobody's: what the daemon would make there, nobody owns
	// the directory of.
	loot := filepath.Join(area, "loot")
	asUser(t, "nobody", "", `mkdir -m 0777 "$1"`, loot)
	const plant = `ln -s "$2" "$1/slots.db"; ln -s "$3/journal" "$1/slots.db.journal"; ln -s "$3/control.sock" "$1/control.sock"`
	for _, tc := range []struct {
		name    string
		prepare func(t *testing.T, state string) // makes state, as nobody or root's mistake
		refused string                           // the path the line names
		owner   string
		mode    string
	}{
		{"nobody's, 0777", func(t *testing.T, state string) {
			asUser(t, "nobody", "", `mkdir -m 0777 "$1"; `+plant, state, secret, loot)
		}, "", "owner nobody (uid 65534)", "mode 0777"},
		{"nobody's, 0700", func(t *testing.T, state string) {
			asUser(t, "nobody", "", `mkdir -m 0700 "$1"; `+plant, state, secret, loot)
		}, "", "owner nobody (uid 65534)", "mode 0700"},
		{"root's, 0777", func(t *testing.T, state string) {
			mkdirMode(t, state, 0o777, 0, 0)
			asUser(t, "nobody", "", plant, state, secret, loot)
		}, "", "owner root (uid 0)", "mode 0777"},
		{"root's, writable by nobody's group", func(t *testing.T, state string) {
			mkdirMode(t, state, 0o770, 0, 65534)
			asUser(t, "nobody", "nogroup", plant, state, secret, loot)
		}, "", "owner root (uid 0)", "mode 0770"},
		{"a link of nobody's to a directory of nobody's", func(t *testing.T, state string) {
			asUser(t, "nobody", "", `mkdir -m 0777 "$1.real"; ln -s "$1.real" "$1"; `+strings.ReplaceAll(plant, `"$1/`, `"$1.real/`), state, secret, loot)
		}, "", "owner nobody (uid 65534)", "mode 0777"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHost(t)
			state := filepath.Join(area, "state-"+h.prefix)
			tc.prepare(t, state)
			t.Cleanup(func() { os.RemoveAll(state); os.RemoveAll(state + ".real") })
			before := snapshot(t, []string{state, state + ".real", loot}, secret, state)
			d := start(t, nil, h.args(freePort(t), "--state-dir="+state)...)
			refusedAtValidate(t, d, h, "--state-dir "+state+" is ", tc.owner, tc.mode)
			sameSnapshot(t, "the planted state directory", before, snapshot(t, []string{state, state + ".real", loot}, secret, state))
		})
	}
}

// mkdirMode makes path with mode (no umask), owner uid and group gid.
func mkdirMode(t *testing.T, path string, mode os.FileMode, uid, gid int) {
	t.Helper()
	if err := os.Mkdir(path, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(path, uid, gid); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

// TestLockDirOfOldBuildsCannotStopAStart: nobody makes the directory
// older builds kept their locks in, /run/lock/phasegate (/run/lock is
// world-writable), and holds the CIDR guard, cidrs.lock, and the lock
// files this daemon's slots and CIDR had there. On its default lock
// directory the daemon starts anyway, takes its locks there and serves.
// /run/lock is a tmpfs of its own for the test (a mount namespace shared
// by nobody's process and the daemon), so that the host's is untouched.
func TestLockDirOfOldBuildsCannotStopAStart(t *testing.T) {
	pub := newPublicDir(t)
	h := newHost(t)
	h.prepareDir() // the netns directory, before the mount namespace copies the host's mounts
	scope, err := lockfile.NetNSScope()
	if err != nil {
		t.Fatal(err)
	}
	cidr := netip.MustParsePrefix(h.cidr)
	legacySlots, err := lockfile.SlotsPath(lockfile.LegacyDir, h.netnsDir, h.prefix)
	if err != nil {
		t.Fatal(err)
	}
	planted := []string{filepath.Join(lockfile.LegacyDir, "cidrs.lock"), legacySlots, lockfile.CIDRPath(lockfile.LegacyDir, scope, cidr)}

	ns := "--target=" + strconv.Itoa(holdInAMountNamespace(t, pub, planted))
	// In the namespace, the world-writable /run/lock and nobody's hold.
	inNS := func(args ...string) *exec.Cmd {
		return exec.Command("nsenter", append([]string{ns, "--mount", "--"}, args...)...)
	}
	heldThere := func() {
		t.Helper()
		for _, p := range planted {
			if err := inNS("flock", "--nonblock", "--conflict-exit-code=75", p, "true").Run(); exitCode(err) != 75 {
				t.Fatalf("%s is not held by nobody in the namespace: %v", p, err)
			}
		}
		out, err := inNS("stat", "-c", "%U %a", lockfile.LegacyDir).CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "nobody 755" {
			t.Fatalf("%s in the namespace: %q %v, want nobody's", lockfile.LegacyDir, out, err)
		}
	}
	heldThere()

	addr := freePort(t)
	d := startBinary(t, "nsenter", nil, append([]string{ns, "--mount", "--", binary}, h.args(addr, "--slots=64")...)...)
	d.waitServing(time.Minute)
	heldThere()
	for _, p := range []string{mustSlotsPath(t, lockfile.DefaultDir, h), lockfile.CIDRPath(lockfile.DefaultDir, scope, cidr)} {
		held, pid, err := lockfile.Probe(context.Background(), p)
		if err != nil || !held || pid != d.Pid() {
			t.Errorf("%s: held %v by pid %d (%v), want held by the daemon, pid %d", p, held, pid, err, d.Pid())
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	resp, err := d.slots().Acquire(ctx, &phasegatev1.AcquireRequest{Owner: "after-the-attack"})
	if err != nil {
		t.Fatalf("Acquire on the daemon nobody tried to stop: %v", err)
	}
	if _, err := d.slots().Release(ctx, &phasegatev1.ReleaseRequest{Index: resp.GetSlot().GetIndex(), LeaseId: resp.GetLeaseId()}); err != nil {
		t.Fatal(err)
	}
	d.signal(syscall.SIGTERM)
	if code := d.wait(time.Minute); code != 0 {
		t.Fatalf("exit %d:\n%s", code, d.Output())
	}
}

// holdInAMountNamespace starts nobody's holder of the planted lock files
// in a mount namespace of its own whose /run/lock is a world-writable
// tmpfs, waits until it holds them, and returns its pid; the holder lets
// go and exits when the test ends.
func holdInAMountNamespace(t *testing.T, pub *publicDir, planted []string) int {
	t.Helper()
	holder := exec.Command("unshare", "--mount", "--propagation=private", "--", "sh", "-ec",
		`mount -t tmpfs -o mode=1777 tmpfs /run/lock; exec runuser -u nobody -- env "$1" "$2"`,
		"sh", holdEnv+"="+strings.Join(planted, ","), pub.testBinary)
	stdin, err := holder.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := holder.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	holder.Stderr = os.Stderr
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close() // the holder lets go and exits
		if err := holder.Wait(); err != nil {
			t.Errorf("nobody's lock holder: %v", err)
		}
	})
	if line, _ := bufio.NewReader(stdout).ReadString('\n'); line != "held\n" {
		t.Fatalf("nobody's lock holder: %q", line)
	}
	return holder.Process.Pid
}

func mustSlotsPath(t *testing.T, dir string, h *host) string {
	t.Helper()
	p, err := lockfile.SlotsPath(dir, h.netnsDir, h.prefix)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestLinksInRootsDirectoriesAreNotFollowed: a link root left by mistake
// in its own state or lock directory, named like a file of the daemon's,
// is refused (exit 2, the last line naming the link), not followed: what
// it points to is neither made, read into the records nor changed; the
// daemon leaves no socket and takes no slot.
func TestLinksInRootsDirectoriesAreNotFollowed(t *testing.T) {
	for _, tc := range []struct {
		name     string
		lockDir  bool   // the link is in the lock directory, else the state directory
		link     string // its name
		dangling bool   // it points to nothing yet: a create through it would make it
	}{
		{"slots.db to a file", false, "slots.db", false},
		{"slots.db dangling", false, "slots.db", true},
		{"slots.db.journal to a file", false, "slots.db.journal", false},
		{"the CIDR guard to a file", true, "cidrs.lock", false},
		{"the CIDR guard dangling", true, "cidrs.lock", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHost(t)
			dir, args := h.stateDir, []string{"--slots=64"}
			if tc.lockDir {
				dir = filepath.Join(t.TempDir(), "locks")
				args = append(args, "--lock-dir="+dir)
			}
			mkdirMode(t, dir, 0o700, 0, 0)
			target := filepath.Join(t.TempDir(), "elsewhere")
			if !tc.dangling {
				if err := os.WriteFile(target, []byte("root's records kept elsewhere\n"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			link := filepath.Join(dir, tc.link)
			if err := os.Symlink(target, link); err != nil {
				t.Fatal(err)
			}
			before := snapshot(t, []string{dir}, target)
			d := start(t, nil, h.args(freePort(t), args...)...)
			if code := d.wait(time.Minute); code != 2 {
				t.Fatalf("exit %d, want 2:\n%s", code, d.Output())
			}
			all := lines(d.Output())
			if last := all[len(all)-1]; !strings.Contains(last, link+" is a symlink: not followed") {
				t.Errorf("the last line does not name the link:\n%s", last)
			}
			after := snapshot(t, []string{dir}, target)
			// The lock directory also gets the slots lock, taken before
			// the CIDR's: nothing else is made beside the link.
			if tc.lockDir {
				for p := range after {
					if strings.HasPrefix(filepath.Base(p), "slots") {
						delete(after, p)
					}
				}
			}
			sameSnapshot(t, "the directory with the link", before, after)
			if got := h.links(h.prefix); len(got) > 0 {
				t.Errorf("the refused daemon made host links %v", got)
			}
			if h.hasTable(h.prefix) {
				t.Error("the refused daemon made its firewall table")
			}
		})
	}
}

// TestLockAndSocketDirsOthersControl: a --lock-dir, or the directory of
// a --control-socket outside the state directory, that another user made
// or that every user may write (sticky or not, as /run/lock and /tmp are)
// is refused with exit 2 in one line naming it, its owner and its mode:
// nothing is made in it, no lock taken there, no socket bound there for a
// rename another user could race.
func TestLockAndSocketDirsOthersControl(t *testing.T) {
	pub := newPublicDir(t)
	area := arena(t, pub)
	nobodys, group, world := filepath.Join(area, "nobodys"), filepath.Join(area, "group"), filepath.Join(area, "world")
	asUser(t, "nobody", "", `mkdir -m 0755 "$1"`, nobodys)
	mkdirMode(t, group, 0o770, 0, 65534)
	mkdirMode(t, world, 0o777, 0, 0)
	dirs := []struct{ name, dir, owner, mode string }{
		{"nobody's", nobodys, "owner nobody (uid 65534)", "mode 0755"},
		{"root's, group-writable", group, "owner root (uid 0)", "mode 0770"},
		{"root's, world-writable", world, "owner root (uid 0)", "mode 0777"},
		{"root's, sticky and world-writable", area, "owner root (uid 0)", "mode 1777"},
	}
	uses := []struct {
		flag string
		args func(dir string) (arg, names string) // the flag, and how the line names dir
	}{
		{"--lock-dir", func(dir string) (string, string) { return "--lock-dir=" + dir, "--lock-dir " + dir + " is " }},
		{"--control-socket", func(dir string) (string, string) {
			sock := filepath.Join(dir, "control.sock")
			return "--control-socket=" + sock, "control socket " + sock + ": " + dir + " is "
		}},
	}
	for _, u := range uses {
		for _, tc := range dirs {
			t.Run(u.flag+"/"+tc.name, func(t *testing.T) {
				h := newHost(t)
				arg, names := u.args(tc.dir)
				before := snapshot(t, []string{tc.dir}, tc.dir)
				d := start(t, nil, h.args(freePort(t), arg)...)
				refusedAtValidate(t, d, h, names, tc.owner, tc.mode)
				sameSnapshot(t, tc.dir, before, snapshot(t, []string{tc.dir}, tc.dir))
			})
		}
	}
}

// TestUpgradeFromABuildThatLockedInRunLock: the image before an in-place
// upgrade was a build that kept its locks in /run/lock/phasegate, and
// hands over their descriptors (here taken by the test, as that build
// took them, and passed by the upgrade's own protocol). The new image
// adopts them, takes its locks again in its lock directory before it lets
// the old ones go, and serves: the slots and the CIDR stay guarded
// against new daemons, and nothing stays locked in /run/lock.
func TestUpgradeFromABuildThatLockedInRunLock(t *testing.T) {
	h := newHost(t)
	ctx := context.Background()
	scope, err := lockfile.NetNSScope()
	if err != nil {
		t.Fatal(err)
	}
	cidr := netip.MustParsePrefix(h.cidr)
	_, statErr := os.Stat(lockfile.LegacyDir)
	legacySlots := mustSlotsPath(t, lockfile.LegacyDir, h)
	legacyCIDR := lockfile.CIDRPath(lockfile.LegacyDir, scope, cidr)
	t.Cleanup(func() {
		for _, p := range []string{legacySlots, legacyCIDR} {
			os.Remove(p)
		}
		if errors.Is(statErr, os.ErrNotExist) {
			os.Remove(filepath.Join(lockfile.LegacyDir, "cidrs.lock"))
			os.Remove(lockfile.LegacyDir) // only if nothing else is there now
		}
	})
	slotsLock, err := lockfile.Acquire(ctx, legacySlots, 0)
	if err != nil {
		t.Fatal(err)
	}
	cidrLock, err := lockfile.AcquireCIDR(ctx, lockfile.LegacyDir, scope, cidr)
	if err != nil {
		slotsLock.Unlock()
		t.Fatal(err)
	}
	addr := freePort(t)
	cmd := exec.Command(binary, h.args(addr, "--slots=64")...)
	cmd.Env = append(os.Environ(), app.UpgradeFDsEnv+"=lock=3,cidr-lock=4")
	cmd.ExtraFiles = []*os.File{slotsLock.File(), cidrLock.File()}
	d := &daemon{t: t, addr: addr, control: filepath.Join(h.stateDir, "control.sock")}
	d.Process = startCmd(t, cmd)
	// The old image's copies go, as its exec closes them: the new image's
	// are the only ones.
	slotsLock.File().Close()
	cidrLock.File().Close()
	d.waitServing(time.Minute)
	if !strings.Contains(d.Output(), "lock moved from where older builds kept it") {
		t.Errorf("no log line says the locks were moved:\n%s", d.Output())
	}
	for p, want := range map[string]bool{
		mustSlotsPath(t, lockfile.DefaultDir, h): true, lockfile.CIDRPath(lockfile.DefaultDir, scope, cidr): true,
		legacySlots: false, legacyCIDR: false,
	} {
		held, pid, err := lockfile.Probe(ctx, p)
		if err != nil || held != want || (want && pid != d.Pid()) {
			t.Errorf("%s: held %v by pid %d (%v), want held %v by the daemon (pid %d)", p, held, pid, err, want, d.Pid())
		}
	}
	// Another daemon on the same CIDR is refused, naming this one.
	other := newHost(t)
	o := start(t, nil, other.args(freePort(t), "--slots=64", "--slot-cidr="+h.cidr)...)
	refusedAtStart(t, o, other, "pid "+strconv.Itoa(d.Pid()))
	d.signal(syscall.SIGTERM)
	if code := d.wait(time.Minute); code != 0 {
		t.Fatalf("exit %d:\n%s", code, d.Output())
	}
}
