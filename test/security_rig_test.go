package test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
)

// floodEnv makes this test binary, run as another user, a client that
// floods a control socket: "SOCKET|METHOD|N" (METHOD list or acquire).
const floodEnv = "PHASEGATE_TEST_FLOOD"

func init() {
	if v := os.Getenv(floodEnv); v != "" {
		os.Exit(flood(v))
	}
}

// flood makes N calls on the socket from 8 goroutines and prints how many
// ended with each code, as JSON.
func flood(spec string) int {
	parts := strings.Split(spec, "|")
	if len(parts) != 3 {
		fmt.Fprintf(os.Stderr, "%s=%q: want SOCKET|METHOD|N\n", floodEnv, spec)
		return 2
	}
	var n int
	fmt.Sscan(parts[2], &n)
	conn, err := grpc.NewClient("unix://"+parts[0], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer conn.Close()
	c := phasegatev1.NewSlotsClient(conn)
	var (
		mu     sync.Mutex
		counts = map[string]int{}
		next   atomic.Int64
		wg     sync.WaitGroup
	)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for range 8 {
		wg.Go(func() {
			for i := next.Add(1); i <= int64(n); i = next.Add(1) {
				var err error
				if parts[1] == "acquire" {
					_, err = c.Acquire(ctx, &phasegatev1.AcquireRequest{Owner: fmt.Sprintf("tenant-b-flood-%d", i)})
				} else {
					_, err = c.List(ctx, &phasegatev1.ListRequest{})
				}
				mu.Lock()
				counts[status.Code(err).String()]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	b, _ := json.Marshal(counts)
	fmt.Println(string(b))
	return 0
}

// publicDir is a directory every user may reach, holding a copy of the
// binary every user may run (the build's own directory is root's) and
// whatever else an unprivileged attacker must read.
type publicDir struct {
	dir, binary, testBinary string
}

func newPublicDir(t *testing.T) *publicDir {
	t.Helper()
	dir, err := os.MkdirTemp("", "phasegate-sec-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	p := &publicDir{dir: dir, binary: filepath.Join(dir, "phasegate"), testBinary: filepath.Join(dir, "test.test")}
	copyFile(t, binary, p.binary, 0o755)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	copyFile(t, self, p.testBinary, 0o755)
	return p
}

func copyFile(t *testing.T, from, to string, mode os.FileMode) {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(to, mode); err != nil {
		t.Fatal(err)
	}
}

// as runs phasegate as user (in group, when set) and returns its output
// and exit code.
func (p *publicDir) as(t *testing.T, user, group string, args ...string) (string, int) {
	t.Helper()
	ra := []string{"-u", user}
	if group != "" {
		ra = append(ra, "-g", group)
	}
	cmd := exec.Command("runuser", append(append(ra, "--", p.binary), args...)...)
	cmd.Dir = p.dir
	out, err := cmd.CombinedOutput()
	code := exitCode(err)
	if code < 0 {
		t.Fatalf("runuser %v: %v", args, err)
	}
	return string(out), code
}

// victimState is what an attack must leave as it was: the lease as root
// sees it, and the kernel's identity of its namespace and host link.
type victimState struct {
	slot    *phasegatev1.Slot
	netnsID uint64
	ifindex int
	// usage is the slot's usage, apart from slot: traffic the victim
	// carries meanwhile adds to it, and it must never go back.
	usage *phasegatev1.Usage
}

func observeVictim(t *testing.T, c phasegatev1.SlotsClient, i uint32) victimState {
	t.Helper()
	return observeVictimIn(t, nil, c, i)
}

// observeVictimIn is observeVictim for a daemon that runs in node n (nil:
// here), where its slots' host links are.
func observeVictimIn(t *testing.T, n *node, c phasegatev1.SlotsClient, i uint32) victimState {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := c.Get(ctx, &phasegatev1.GetRequest{Index: i})
	if err != nil {
		t.Fatalf("Get(%d) as root: %v", i, err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(resp.GetSlot().GetNetnsPath(), &st); err != nil {
		t.Fatalf("the victim's namespace: %v", err)
	}
	var ifc *net.Interface
	lookup := func() (err error) {
		ifc, err = net.InterfaceByName(resp.GetSlot().GetHostInterface())
		return err
	}
	if n != nil {
		err = n.inNamespace(lookup)
	} else {
		err = lookup()
	}
	if err != nil {
		t.Fatalf("the victim's host link: %v", err)
	}
	// What the victim's own policy dropped is its traffic, not its
	// state: a late segment of the probe's connection closed under load
	// (conntrack no longer sees it as established) is dropped and counted
	// without anything having touched the lease.
	sl := resp.GetSlot()
	sl.EgressDroppedPackets = 0
	usage := sl.GetUsage()
	sl.Usage = nil
	return victimState{slot: sl, netnsID: st.Ino, ifindex: ifc.Index, usage: usage}
}

func (v victimState) same(t *testing.T, after victimState, what string) {
	t.Helper()
	if !proto.Equal(v.slot, after.slot) || v.netnsID != after.netnsID || v.ifindex != after.ifindex {
		t.Fatalf("after %s the victim changed:\nbefore %v netns inode %d ifindex %d\nafter  %v netns inode %d ifindex %d",
			what, v.slot, v.netnsID, v.ifindex, after.slot, after.netnsID, after.ifindex)
	}
	notBelow(t, "after "+what+", the victim's", after.usage, v.usage)
}

// watchHealth polls /readyz until stopped and returns how many polls
// answered something else than 200.
func watchHealth(t *testing.T, d *daemon) (stop func() (polls, failed int)) {
	var polls, failed atomic.Int64
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			case <-time.After(20 * time.Millisecond):
			}
			code, _, err := d.get("/readyz")
			polls.Add(1)
			if err != nil || code != http.StatusOK {
				failed.Add(1)
			}
		}
	})
	return func() (int, int) {
		close(done)
		wg.Wait()
		return int(polls.Load()), int(failed.Load())
	}
}

// wantRefused checks a CLI call failed with code in its one-line error.
func wantRefused(t *testing.T, what, out string, exit int, code string) {
	t.Helper()
	if exit != 1 || !strings.Contains(out, ": "+code+": ") {
		t.Errorf("%s: exit %d %q, want exit 1 and %s", what, exit, strings.TrimSpace(out), code)
	}
}

// flood runs the flood client as user against sock.
func (p *publicDir) flood(t *testing.T, user, sock, method string, n int) map[string]int {
	t.Helper()
	cmd := exec.Command("runuser", "-u", user, "--", p.testBinary)
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s|%s|%d", floodEnv, sock, method, n))
	cmd.Dir = p.dir
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("flood as %s: %v %s", user, err, out)
	}
	res := map[string]int{}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("flood as %s: %q: %v", user, out, err)
	}
	return res
}
