package test

import (
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// `make run` hands ARGS to serve, as README shows: the daemon checks the
// configuration it was given (--check, which creates nothing) and prints
// it resolved, with the CIDR and the directories of ARGS, and as many
// slots as the /24 holds (128, a quarter of them a principal's quota).
func TestMakeRunPassesArgs(t *testing.T) {
	h := newHost(t)
	args := strings.Join([]string{"--check", "--slot-cidr=10.99.0.0/24",
		"--state-dir=" + h.stateDir, "--netns-dir=" + h.netnsDir, "--slot-prefix=" + h.prefix,
		"--listen=" + freePort(t)}, " ")
	// Should ARGS not reach serve, the environment still keeps it off the
	// host: its own directories and prefix, and a port taken, so that it
	// exits 2 at once having made nothing (flags win over PHASEGATE_*).
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	cmd := exec.Command("make", "-C", "..", "--no-print-directory", "--quiet", "run", "ARGS="+args)
	cmd.Env = append(os.Environ(), "PHASEGATE_LISTEN="+busy.Addr().String(), "PHASEGATE_STATE_DIR="+h.stateDir,
		"PHASEGATE_NETNS_DIR="+h.netnsDir, "PHASEGATE_SLOT_PREFIX="+h.prefix)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("make run ARGS=%q: %v\n%s", args, err, out)
	}
	// make echoes the commands it runs; the JSON is what serve printed.
	text := string(out)
	if i := strings.Index(text, "{"); i >= 0 {
		text = text[i:]
	}
	var got struct {
		SlotCIDR  string `json:"slot_cidr"`
		Slots     int    `json:"slots"`
		MaxLeases int    `json:"max_leases"`
		StateDir  string `json:"state_dir"`
		Prefix    string `json:"slot_prefix"`
	}
	if err := json.Unmarshal([]byte(text), &got); err != nil {
		t.Fatalf("make run ARGS=%q printed no configuration: %v\n%s", args, err, out)
	}
	if got.SlotCIDR != "10.99.0.0/24" || got.Slots != 128 || got.MaxLeases != 32 || got.StateDir != h.stateDir || got.Prefix != h.prefix {
		t.Errorf("make run ran serve with %+v, not ARGS %q", got, args)
	}
}
