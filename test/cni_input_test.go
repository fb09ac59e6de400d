package test

import (
	"bytes"
	"encoding/json"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	cniv1 "github.com/phasegate/phasegate/api/cni/v1"
)

// Input checked at every door (finding 8, and the plugin's stdin). nobody,
// granted attach for its network and leases of it, sends keys the kernel
// would not make as they are — a NUL in the interface name (which the
// kernel reads as its end: the link would be "eth", the record "eth\0x"),
// an alias's ':', a template's '%', 16 bytes, "..", a '/', a space — and a
// NUL in the container id and in the network's name: straight to the
// socket (its own namespace passed, so that nothing but the name is
// wrong), through the plugin, and through the Slots API as an attachment's
// owner and request id. Each door refuses each with the same rule, the
// spec's code for the field; nothing is made: no lease, no link in its
// namespace. A configuration of 300 MB on the plugin's stdin is refused
// with the spec's code for an invalid configuration after 1 MiB is read,
// at once and in a few MB of memory.
func TestCNIInputAtEveryDoor(t *testing.T) {
	pub := newPublicDir(t)
	h := newHost(t)
	addr := freePort(t)
	sock := filepath.Join(pub.dir, "control.sock")
	nbNet := h.prefix + "nb"
	d := start(t, nil, h.args(addr, "--slots=16", "--control-socket="+sock, "--control-group=nogroup",
		"--allow-attach=uid:65534=cni/"+nbNet)...)
	d.waitServing(time.Minute)
	own, ownPid := ownNetns(t, 65534, 65534)
	nb := newCNINet(t, nbNet, sock, nil)
	for _, tc := range []struct {
		what                   string
		network, id, ifname    string
		code                   uint
		want                   string
		viaPlugin, viaSlotsAPI bool // whether the plugin and the Slots API can carry it
	}{
		{"NUL in the interface name", nbNet, "c1", "eth\x00x", 4, `CNI_IFNAME "eth\x00x": U+0000, a control character, at byte 3`, false, false},
		{"an alias", nbNet, "c1", "eth0:1", 4, `CNI_IFNAME "eth0:1": ':' at byte 4`, false, true},
		{"a template", nbNet, "c1", "eth%d", 4, `CNI_IFNAME "eth%d": '%' at byte 3`, true, true},
		{"16 bytes", nbNet, "c1", "abcdefghijklmnop", 4, `"abcdefghijklmnop": 16 bytes`, false, true},
		{"dot-dot", nbNet, "c1", "..", 4, `"..": a directory's name`, false, true},
		{"a slash", nbNet, "c1", "a/b", 4, `CNI_IFNAME "a/b": '/' at byte 1`, false, true},
		{"a space", nbNet, "c1", "eth 0", 4, `U+0020, a space`, false, true},
		{"NUL in the container id", nbNet, "c\x001", "eth0", 4, `CNI_CONTAINERID "c\x001": U+0000`, false, false},
		{"NUL in the network", nbNet + "\x00x", "c1", "eth0", 7, `network name "` + nbNet + `\x00x": U+0000`, false, false},
	} {
		t.Run(tc.what, func(t *testing.T) {
			body := map[string]any{"network": tc.network, "containerID": tc.id, "ifName": tc.ifname, "netns": own}
			perr := pub.raw(t, "nobody", "", sock, cniv1.PathAdd, own, body)
			if perr == nil || perr.Code != tc.code || !strings.Contains(perr.Msg, tc.want) {
				t.Errorf("straight to the socket: %+v, want code %d naming %q", perr, tc.code, tc.want)
			}
			if tc.viaPlugin {
				perr := pub.plugin(t, "nobody", "", "ADD", nb.conf, "CNI_CONTAINERID="+tc.id, "CNI_IFNAME="+tc.ifname, "CNI_NETNS="+own)
				if perr == nil || perr.Code != tc.code || !strings.Contains(perr.Msg, tc.want) {
					t.Errorf("through the plugin: %+v, want code %d naming %q", perr, tc.code, tc.want)
				}
			}
			if tc.viaSlotsAPI {
				out, code := pub.as(t, "nobody", "", "slots", "acquire", cniv1.OwnerPrefix+tc.network, "--request-id="+tc.id+"/"+tc.ifname, "--socket="+sock)
				// The Slots API makes no attachment at all (Acquire refuses
				// every owner under cni/): a bad key is refused there too,
				// by the names rule or as a CNI network's owner.
				if code == 0 || !strings.Contains(out, "InvalidArgument") && !strings.Contains(out, "PermissionDenied") {
					t.Errorf("through the Slots API: exit %d, want InvalidArgument or PermissionDenied:\n%s", code, out)
				}
			}
		})
	}
	if l := cniLeases(t, d, nbNet); len(l) != 0 {
		t.Errorf("refused keys left %d leases", len(l))
	}
	if got := linksIn(t, ownPid); len(got) != 0 {
		t.Errorf("refused keys left links in nobody's namespace: %v", got)
	}

	hugeConfigurationRefused(t, nb, own)
	if l := cniLeases(t, d, nbNet); len(l) != 0 {
		t.Errorf("the refused configuration left %d leases", len(l))
	}
}

// hugeConfigurationRefused sends the plugin 300 MB on stdin, from a
// writer that would go on: the plugin stops at its bound (1 MiB) and
// answers code 7 at once, having read under 2 MiB and held about what a
// small configuration's run holds.
func hugeConfigurationRefused(t *testing.T, nb *cniNet, own string) {
	t.Helper()
	// 300 MB on stdin, from a writer that would go on: the plugin stops at
	// its bound and answers. The memory a child of this process reports
	// starts at this process's own (Go forks with CLONE_VM): the plugin's
	// is what a small configuration's run does not have.
	plugin := func(stdin io.Reader) (*exec.Cmd, []byte, error) {
		cmd := exec.Command(filepath.Join(cniPath, "phasegate-cni"))
		cmd.Env = []string{"CNI_COMMAND=ADD", "CNI_PATH=" + cniPath, "CNI_CONTAINERID=big", "CNI_IFNAME=eth0", "CNI_NETNS=" + own}
		cmd.Stdin = stdin
		out, err := cmd.Output()
		return cmd, out, err
	}
	maxRSS := func(cmd *exec.Cmd) int64 { return cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss } // KiB
	small, _, _ := plugin(bytes.NewReader(nb.confWith(map[string]any{"socket": "/nonexistent"})))
	pad := &countingReader{r: io.LimitReader(endless{}, 300<<20)}
	begin := time.Now()
	cmd, out, err := plugin(io.MultiReader(bytes.NewReader(nb.conf[:len(nb.conf)-1]), strings.NewReader(`,"pad":"`), pad, strings.NewReader(`"}`)))
	took := time.Since(begin)
	var pe pluginError
	if err == nil || json.Unmarshal(out, &pe) != nil || pe.Code != 7 || !strings.Contains(pe.Msg, "over 1048576 bytes") {
		t.Errorf("ADD with 300 MB on stdin: %v %q, want code 7 naming the bound", err, out)
	}
	t.Logf("ADD with 300 MB on stdin: refused in %v having taken %d bytes of it, %d KiB resident at most (%d KiB with a small configuration)", took, pad.n.Load(), maxRSS(cmd), maxRSS(small))
	// The bound, the pipe's buffer and the copy's: well under 2 MiB.
	if n := pad.n.Load(); n > 2<<20 {
		t.Errorf("the plugin took %d bytes of a 300 MB stdin: it read past its bound", n)
	}
	if maxRSS(cmd) > maxRSS(small)+16<<10 {
		t.Errorf("the plugin held %d KiB reading a 300 MB stdin, %d KiB with a small configuration", maxRSS(cmd), maxRSS(small))
	}
}

// countingReader counts what is read of r.
type countingReader struct {
	r io.Reader
	n atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// endless reads as endless 'a's.
type endless struct{}

func (endless) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'a'
	}
	return len(p), nil
}
