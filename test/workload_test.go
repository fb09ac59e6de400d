package test

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// workloadEnv makes the test binary a workload instead of running tests: a
// TCP echo server on the address it names, started inside a slot's
// namespace with nsenter, the way a sandbox's process lives in its slot.
const workloadEnv = "PHASEGATE_TEST_WORKLOAD"

// runWorkload echoes every line back until killed.
func runWorkload(addr string) int {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "workload:", err)
		return 1
	}
	fmt.Println("listening")
	for {
		c, err := l.Accept()
		if err != nil {
			return 1
		}
		go func() {
			defer c.Close()
			sc := bufio.NewScanner(c)
			for sc.Scan() {
				if _, err := fmt.Fprintln(c, sc.Text()); err != nil {
					return
				}
			}
		}()
	}
}

// workload is a process inside a slot, answering on the slot's inside
// address, and a prober on the host that talks to it over the slot's veth
// every few milliseconds: a workload that loses its network, even for a
// moment, is counted.
type workload struct {
	slot     uint32
	addr     string
	pid      int // the workload's process, when startWorkload ran it
	ok, fail atomic.Int64
	mu       sync.Mutex
	lastErr  error
	stop     chan struct{}
	done     chan struct{}
}

const workloadPort = "7777"

// startWorkload runs a workload in the namespace at netnsPath listening on
// insideAddr (no prefix length), and starts probing it once it answers.
func startWorkload(t *testing.T, index uint32, netnsPath, insideAddr string) *workload {
	t.Helper()
	cmd := exec.Command("nsenter", "--net="+netnsPath, os.Args[0])
	cmd.Env = append(os.Environ(), workloadEnv+"="+net.JoinHostPort(insideAddr, workloadPort))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "listening\n" {
		t.Fatalf("workload in slot %d: %q %v", index, line, err)
	}
	w := probeEcho(index, net.JoinHostPort(insideAddr, workloadPort))
	w.pid = cmd.Process.Pid // nsenter execs the workload: one pid
	return w
}

// probeEcho starts probing a line echo at addr that something else runs
// (a container's), labelled with slot index.
func probeEcho(index uint32, addr string) *workload {
	w := &workload{slot: index, addr: addr, stop: make(chan struct{}), done: make(chan struct{})}
	go w.probe()
	return w
}

// probe talks to the workload over one connection, reconnecting when it
// breaks, every 20 ms, until stopped.
func (w *workload) probe() {
	defer close(w.done)
	var c net.Conn
	var r *bufio.Reader
	for n := 0; ; n++ {
		select {
		case <-w.stop:
			if c != nil {
				c.Close()
			}
			return
		case <-time.After(20 * time.Millisecond):
		}
		err := func() error {
			if c == nil {
				var err error
				if c, err = net.DialTimeout("tcp", w.addr, time.Second); err != nil {
					c = nil
					return err
				}
				r = bufio.NewReader(c)
			}
			_ = c.SetDeadline(time.Now().Add(time.Second))
			msg := fmt.Sprintf("probe %d", n)
			if _, err := fmt.Fprintln(c, msg); err != nil {
				return err
			}
			got, err := r.ReadString('\n')
			if err != nil {
				return err
			}
			if got != msg+"\n" {
				return fmt.Errorf("echo %q, sent %q", got, msg)
			}
			return nil
		}()
		if err != nil {
			if c != nil {
				c.Close()
				c = nil
			}
			w.fail.Add(1)
			w.mu.Lock()
			w.lastErr = err
			w.mu.Unlock()
			continue
		}
		w.ok.Add(1)
	}
}

// finish stops probing and reports.
func (w *workload) finish() (ok, failed int64, last error) {
	close(w.stop)
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.ok.Load(), w.fail.Load(), w.lastErr
}
