package test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// cniRawEnv makes this test binary, run as another user, a caller of one
// CNI route straight on the control socket, as an attacker without the
// plugin calls it: a JSON rawCall. It opens Pass (when set) with its own
// credentials and passes it with the request's first bytes (SCM_RIGHTS),
// as the plugin passes CNI_NETNS, sends Body to Route as HTTP/1.0, and
// prints the daemon's error object, or {} when the call succeeded.
const cniRawEnv = "PHASEGATE_TEST_CNI_RAW"

type rawCall struct {
	Socket string          `json:"socket"`
	Route  string          `json:"route"`
	Pass   string          `json:"pass,omitempty"`
	Body   json.RawMessage `json:"body"`
}

func init() {
	if v := os.Getenv(cniRawEnv); v != "" {
		os.Exit(callRaw(v))
	}
}

func callRaw(spec string) int {
	var c rawCall
	if err := json.Unmarshal([]byte(spec), &c); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	var rights []byte
	if c.Pass != "" {
		// Opened as an attacker opens it: for reading, nothing checked.
		fd, err := unix.Open(c.Pass, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		defer unix.Close(fd)
		rights = unix.UnixRights(fd)
	}
	conn, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: c.Socket, Net: "unix"})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	req := fmt.Sprintf("POST %s HTTP/1.0\r\nHost: phasegate\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", c.Route, len(c.Body), c.Body)
	if _, _, err := conn.WriteMsgUnix([]byte(req), rights, nil); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	raw, err := io.ReadAll(conn)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	head, body, _ := strings.Cut(string(raw), "\r\n\r\n")
	if strings.HasPrefix(head, "HTTP/1.0 200 ") || strings.HasPrefix(head, "HTTP/1.1 200 ") {
		fmt.Println("{}")
	} else {
		fmt.Println(body)
	}
	return 0
}

// raw makes one rawCall as user (in group, when set): body to route on
// socket, passing the file at pass unless it is "". It returns the daemon's
// error object, nil when the call succeeded.
func (p *publicDir) raw(t *testing.T, user, group, socket, route, pass string, body any) *pluginError {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	spec, err := json.Marshal(rawCall{Socket: socket, Route: route, Pass: pass, Body: b})
	if err != nil {
		t.Fatal(err)
	}
	ra := []string{"-u", user}
	if group != "" {
		ra = append(ra, "-g", group)
	}
	cmd := exec.Command("runuser", append(ra, "--", "env", cniRawEnv+"="+string(spec), p.testBinary)...)
	cmd.Dir = p.dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the raw call to %s as %s: %v: %s", route, user, err, stderr.String())
	}
	if strings.TrimSpace(string(out)) == "{}" {
		return nil
	}
	var pe pluginError
	if err := json.Unmarshal(out, &pe); err != nil || pe.Code == 0 {
		t.Fatalf("the raw call to %s as %s: %q: no error object", route, user, out)
	}
	return &pe
}

// ownNetns makes a network namespace as user uid (group gid) makes one
// for its own containers without privilege, as a rootless runtime does: in
// a user namespace of its own whose root is that user (`unshare --user
// --map-root-user --net`), held by a process. It returns the namespace's
// path as that process's /proc names it, which that user may open (and
// root), and the pid. The process, and the namespace with it, ends with
// the test.
func ownNetns(t *testing.T, uid, gid uint32) (string, int) {
	t.Helper()
	cmd := exec.Command("unshare", "--user", "--map-root-user", "--net", "cat")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid}}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.Close(); _ = cmd.Wait() })
	pid := cmd.Process.Pid
	// unshare execs cat once the namespaces are made.
	waitFor(t, 10*time.Second, "uid "+strconv.Itoa(int(uid))+"'s namespaces", func() bool {
		exe, _ := os.Readlink("/proc/" + strconv.Itoa(pid) + "/exe")
		return filepath.Base(exe) == "cat"
	})
	return "/proc/" + strconv.Itoa(pid) + "/ns/net", pid
}

// containerNetnsIn is containerNetns in a directory of parent, which every
// user may reach when parent is public: a namespace a runtime running as
// root made, bound at a file any user can open, as /run/netns/<name> is.
func containerNetnsIn(t *testing.T, parent, name string) string {
	t.Helper()
	dir, err := os.MkdirTemp(parent, "ctr-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// A private mount, so that the namespace's bind mount does not
	// propagate (unshare refuses a shared parent).
	run(t, "mount", "--bind", dir, dir)
	run(t, "mount", "--make-private", dir)
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	run(t, "unshare", "--net="+path, "true")
	t.Cleanup(func() {
		_ = unix.Unmount(path, unix.MNT_DETACH)
		_ = unix.Unmount(dir, unix.MNT_DETACH)
	})
	return path
}

// containerState is what an attack on a container's namespace must leave
// as it was: the namespace itself, its links, its IPv4 addresses and
// routes (IPv6's link-local ones come and go by themselves).
type containerState struct {
	inode                uint64
	links, addrs, routes string
}

// observeContainer reads the state of the container's namespace at path.
func observeContainer(t *testing.T, path string) containerState {
	t.Helper()
	return containerState{
		inode:  nsInode(t, path),
		links:  inNetns(t, path, "ip", "-br", "link"),
		addrs:  inNetns(t, path, "ip", "-4", "-br", "addr"),
		routes: inNetns(t, path, "ip", "-4", "route", "show", "table", "all"),
	}
}

// same fails the test naming what differs from before, after what.
func (before containerState) same(t *testing.T, after containerState, what string) {
	t.Helper()
	if before != after {
		t.Errorf("the victim container's namespace changed after %s:\nbefore: %+v\nafter:  %+v", what, before, after)
	}
}

// linksIn are the names of the links in the namespace of process pid,
// but lo.
func linksIn(t *testing.T, pid int) []string {
	t.Helper()
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(run(t, "nsenter", "-t", strconv.Itoa(pid), "-n", "--", "ip", "-br", "link")), "\n") {
		if name, _, _ := strings.Cut(strings.Fields(l)[0], "@"); name != "lo" {
			out = append(out, name)
		}
	}
	return out
}
