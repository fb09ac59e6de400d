package iperf

import (
	"encoding/json"
	"errors"
	"math/rand/v2"
	"net/netip"
	"os/exec"
	"strconv"
	"testing"
	"time"
)

// wireOverhead is what a TCP segment carries on an Ethernet link beside
// its payload (Ethernet 14, IPv4 20, TCP 20 and its timestamps 12): the
// kernel's shapers count frames, iperf3 payload.
const wireOverhead = 66

// Throughput runs iperf3 for d between a client in the namespace bound at
// client ("" for the caller's own) and a server at to in the namespace
// bound at server (a slot's, which may not open connections to the host:
// the client is the host's), TCP into the server's namespace, or out of
// it (iperf3's reverse mode), and returns what the receiver got in bits
// per second on the wire (iperf3's payload rate with the frame's headers
// added back, at the connection's MSS). It skips the test without iperf3
// (tools/deps.sh installs it).
func Throughput(t testing.TB, client, server string, to netip.Addr, d time.Duration, out bool) float64 {
	t.Helper()
	if _, err := exec.LookPath("iperf3"); err != nil {
		t.Skip("iperf3 not installed (tools/deps.sh)")
	}
	port := strconv.Itoa(20000 + rand.IntN(20000))
	srv := exec.Command("nsenter", "--net="+server, "--", "iperf3", "-s", "-1", "-B", to.String(), "-p", port)
	if err := srv.Start(); err != nil {
		t.Fatalf("start iperf3 -s in %s: %v", server, err)
	}
	t.Cleanup(func() {
		_ = srv.Process.Kill()
		_ = srv.Wait()
	})
	var r result
	var b []byte
	var err error
	for range 100 {
		// The server listens a moment after its start; until then the
		// client says so in its JSON and exits 0.
		b, err = clientCommand(client, to, port, d, out).Output()
		if err == nil {
			r = result{}
			if err = json.Unmarshal(b, &r); err == nil && r.Error != "" {
				err = errors.New(r.Error)
			}
		}
		if err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("iperf3 to %s: %v: %s", to, err, b)
	}
	mss := r.Start.MSS
	if mss <= 0 {
		mss = 1448
	}
	return r.End.Received.BPS * float64(mss+wireOverhead) / float64(mss)
}

// clientCommand is iperf3's client to the server at to:port, in the
// namespace bound at ns ("" for the caller's own).
func clientCommand(ns string, to netip.Addr, port string, d time.Duration, out bool) *exec.Cmd {
	args := []string{"iperf3", "-c", to.String(), "-p", port, "-J", "-t", strconv.Itoa(int(d.Seconds()))}
	if out {
		args = append(args, "-R")
	}
	if ns != "" {
		args = append([]string{"nsenter", "--net=" + ns, "--"}, args...)
	}
	return exec.Command(args[0], args[1:]...)
}

// result is what Throughput reads of iperf3's JSON.
type result struct {
	Error string `json:"error"`
	Start struct {
		MSS int `json:"tcp_mss_default"`
	} `json:"start"`
	End struct {
		Received struct {
			BPS float64 `json:"bits_per_second"`
		} `json:"sum_received"`
	} `json:"end"`
}
