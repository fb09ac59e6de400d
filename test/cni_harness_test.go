package test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// cniPath is the plugin directory `make cni-plugin` installed the CNI
// plugin into for the tests (runMain), as an operator installs it.
var cniPath string

// installCNIPlugin runs `make cni-plugin` into a plugin directory of dir.
func installCNIPlugin(dir string) error {
	cniPath = filepath.Join(dir, "cni")
	cmd := exec.Command("make", "-C", "..", "--no-print-directory", "cni-plugin", "CNI_PATH="+cniPath)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	return cmd.Run()
}

// cniNet is a CNI network of the phasegate plugin for one test: its
// conflist in a directory of its own, for cnitool and for the plugin
// exec'd as a runtime does.
type cniNet struct {
	t       *testing.T
	name    string
	confDir string
	conf    []byte // the plugin's configuration, as a runtime gives it on stdin
	cnitool string
}

// newCNINet writes the conflist of network name, of spec 1.1.0: the plugin
// talking to the daemon on socket, with the plugin fields extra adds.
// cnitool's cache of the network's results is removed when the test ends.
func newCNINet(t *testing.T, name, socket string, extra map[string]any) *cniNet {
	t.Helper()
	return newCNINetOf(t, "1.1.0", name, socket, extra)
}

// newCNINetOf is newCNINet of spec version: 1.0.0 for the runtimes here,
// whose CNI library predates 1.1.0.
func newCNINetOf(t *testing.T, version, name, socket string, extra map[string]any) *cniNet {
	t.Helper()
	plugin := map[string]any{"type": "phasegate-cni", "socket": socket, "timeout": "20s"}
	for k, v := range extra {
		plugin[k] = v
	}
	list := map[string]any{"cniVersion": version, "name": name, "plugins": []any{plugin}}
	b, err := json.MarshalIndent(list, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "net.d")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "10-"+name+".conflist"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	plugin["cniVersion"], plugin["name"] = version, name
	conf, err := json.Marshal(plugin)
	if err != nil {
		t.Fatal(err)
	}
	n := &cniNet{t: t, name: name, confDir: dir, conf: conf, cnitool: lookTool(t, "cnitool", "tools/deps.sh")}
	t.Cleanup(func() { n.forgetCache() })
	return n
}

// forgetCache removes what libcni (in cnitool) cached of this network's
// attachments: as a runtime whose state was lost.
func (n *cniNet) forgetCache() {
	matches, _ := filepath.Glob(filepath.Join("/var/lib/cni/results", n.name+"-*"))
	for _, m := range matches {
		_ = os.Remove(m)
	}
}

// tool runs cnitool verb on the network for the namespace at netns (whose
// path cnitool hashes into the container id), with env added (CNI_IFNAME).
func (n *cniNet) tool(verb, netns string, env ...string) (string, error) {
	cmd := exec.Command(n.cnitool, verb, n.name, netns)
	cmd.Env = append(append(os.Environ(), "NETCONFPATH="+n.confDir, "CNI_PATH="+cniPath), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if err != nil {
		return out.String(), fmt.Errorf("cnitool %s: %w: %s%s", verb, err, errb.String(), out.String())
	}
	return out.String(), nil
}

// mustTool is tool that fails the test on error.
func (n *cniNet) mustTool(verb, netns string, env ...string) string {
	n.t.Helper()
	out, err := n.tool(verb, netns, env...)
	if err != nil {
		n.t.Fatal(err)
	}
	return out
}

// pluginError is the CNI spec's error object the plugin prints.
type pluginError struct {
	Code    uint   `json:"code"`
	Msg     string `json:"msg"`
	Details string `json:"details"`
}

// exec runs the installed plugin once, as a runtime does: CNI_COMMAND
// verb, the CNI_* variables of env, conf on stdin. It returns what the
// plugin printed, and its error object when it failed.
func (n *cniNet) exec(verb string, conf []byte, env ...string) (string, *pluginError) {
	n.t.Helper()
	cmd := exec.Command(filepath.Join(cniPath, "phasegate-cni"))
	cmd.Env = append([]string{"CNI_COMMAND=" + verb, "CNI_PATH=" + cniPath}, env...)
	cmd.Stdin = bytes.NewReader(conf)
	out, err := cmd.Output()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return string(out), nil
	case errors.As(err, &ee):
		var pe pluginError
		if jerr := json.Unmarshal(out, &pe); jerr != nil || pe.Code == 0 {
			n.t.Fatalf("plugin %s failed without the spec's error object: %v: %q %s", verb, err, out, ee.Stderr)
		}
		return string(out), &pe
	}
	n.t.Fatalf("plugin %s: %v", verb, err)
	return "", nil
}

// confWith is the plugin's configuration with fields changed (nil:
// removed).
func (n *cniNet) confWith(fields map[string]any) []byte {
	n.t.Helper()
	var m map[string]any
	if err := json.Unmarshal(n.conf, &m); err != nil {
		n.t.Fatal(err)
	}
	for k, v := range fields {
		if v == nil {
			delete(m, k)
		} else {
			m[k] = v
		}
	}
	b, err := json.Marshal(m)
	if err != nil {
		n.t.Fatal(err)
	}
	return b
}

// containerNetns makes a network namespace the way a runtime does, bound
// at a file of its own, and removes it when the test ends: the container's
// end of an attachment goes with it.
func containerNetns(t *testing.T, name string) string {
	t.Helper()
	return containerNetnsIn(t, t.TempDir(), name)
}

// inNetns runs a command inside the namespace at path.
func inNetns(t *testing.T, path string, argv ...string) string {
	t.Helper()
	return run(t, "nsenter", append([]string{"--net=" + path, "--"}, argv...)...)
}

// nsInode is the inode of the namespace bound at path.
func nsInode(t *testing.T, path string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// cniResult is the part of an ADD result the tests read.
type cniResult struct {
	CNIVersion string `json:"cniVersion"`
	Interfaces []struct {
		Name    string `json:"name"`
		Mac     string `json:"mac"`
		Sandbox string `json:"sandbox"`
	} `json:"interfaces"`
	IPs []struct {
		Address   string `json:"address"`
		Gateway   string `json:"gateway"`
		Interface *int   `json:"interface"`
	} `json:"ips"`
	Routes []struct {
		Dst string `json:"dst"`
		GW  string `json:"gw"`
	} `json:"routes"`
}

// parseResult reads an ADD result, failing the test unless it lists the
// host end, the container's end in sandbox and one address on it.
func parseResult(t *testing.T, out, sandbox string) cniResult {
	t.Helper()
	var r cniResult
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("ADD result: %v:\n%s", err, out)
	}
	if len(r.Interfaces) != 2 || r.Interfaces[1].Sandbox != sandbox || r.Interfaces[0].Sandbox != "" ||
		len(r.IPs) != 1 || r.IPs[0].Interface == nil || *r.IPs[0].Interface != 1 || len(r.Routes) != 1 || r.Routes[0].Dst != "0.0.0.0/0" {
		t.Fatalf("ADD result does not list the host end, the container's end in %s, its address and the default route:\n%s", sandbox, out)
	}
	return r
}

// insideAddr is the result's address without its prefix length.
func (r cniResult) insideAddr() string {
	a, _, _ := strings.Cut(r.IPs[0].Address, "/")
	return a
}
