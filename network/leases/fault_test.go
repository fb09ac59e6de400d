package leases

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// helperEnv makes the test binary a helper process (see TestHelperProcess).
const helperEnv = "PHASEGATE_LEASES_HELPER"

// TestHelperProcess is not a test: run with helperEnv set, it is the other
// process of the lock and permission tests.
//
//	hold <path>: open the store, print "ready", hold it until stdin closes
//	open <path>: open the store and print the error's type
//	write <path>: open the store without fsync (SyncNever) and Put leased
//	  records from 16 goroutines until killed, printing "put <index>
//	  <lease id>" after each Put returned
func TestHelperProcess(t *testing.T) {
	mode := os.Getenv(helperEnv)
	if mode == "" {
		t.Skip("helper process only")
	}
	path := os.Getenv(helperEnv + "_PATH")
	if mode == "write" {
		writeUntilKilled(path, os.Getenv(helperEnv+"_BASE"))
	}
	s, err := Open(path, Options{})
	switch mode {
	case "hold":
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		fmt.Println("ready")
		_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
		s.Close()
		os.Exit(0)
	case "open":
		var ae *AccessError
		switch {
		case err == nil:
			fmt.Println("opened")
		case errors.As(err, &ae) && errors.Is(err, fs.ErrPermission) && ae.Path == path:
			fmt.Println("access:", err)
		default:
			fmt.Printf("other %T: %v\n", err, err)
		}
		os.Exit(0)
	}
}

// writeUntilKilled is the helper's write mode: every goroutine writes
// indices of its own, each once, from base on.
func writeUntilKilled(path, base string) {
	s, err := Open(path, Options{Sync: SyncNever})
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	from, _ := strconv.Atoi(base)
	var out sync.Mutex
	for g := range killWriters {
		go func() {
			for k := 0; ; k++ {
				i := from + k*killWriters + g
				r := leased(i, "owner", fmt.Sprint("req-", i))
				if err := s.Put(context.Background(), r); err != nil {
					fmt.Println("error:", err)
					os.Exit(1)
				}
				out.Lock()
				fmt.Println("put", i, r.LeaseID) // one write(2): a line is told whole or not at all
				out.Unlock()
			}
		}()
	}
	select {}
}

// killWriters is the number of concurrent writers the kill test runs.
const killWriters = 16

func helper(t *testing.T, mode, path string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$")
	cmd.Env = append(os.Environ(), helperEnv+"="+mode, helperEnv+"_PATH="+path)
	return cmd
}

func TestLockedByAnotherProcess(t *testing.T) {
	path := filepath.Join(t.TempDir(), "leases.db")
	cmd := helper(t, "hold", path)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); cmd.Wait() })
	line, _ := bufio.NewReader(stdout).ReadString('\n')
	if line != "ready\n" {
		t.Fatalf("helper said %q", line)
	}

	for _, timeout := range []time.Duration{0, 200 * time.Millisecond} {
		_, err := Open(path, Options{LockTimeout: timeout})
		var le *LockedError
		if !errors.As(err, &le) || le.Path != path || le.PID != cmd.Process.Pid {
			t.Fatalf("Open (timeout %v) of a held file: %v, want *LockedError naming pid %d", timeout, err, cmd.Process.Pid)
		}
	}
	if _, err := MoveAside(path); !errors.As(err, new(*LockedError)) {
		t.Fatalf("MoveAside of a held file: %v, want *LockedError", err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("the held file was touched: %v", err)
	}

	stdin.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("helper: %v", err)
	}
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatalf("Open after the holder exited: %v", err)
	}
	defer s.Close()

	// The same process opening it twice is refused too (two flocks on two
	// open files conflict).
	_, err = Open(path, Options{})
	var le *LockedError
	if !errors.As(err, &le) || le.PID != os.Getpid() {
		t.Fatalf("second Open in one process: %v, want *LockedError naming our pid", err)
	}
}

func TestUnreadableFileGivesAccessError(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run the other process as nobody")
	}
	dir, err := os.MkdirTemp("", "leases-access")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path, _ := validStore(t, 10)
	data := readFile(t, path)
	path = filepath.Join(dir, "leases.db")
	if err := os.WriteFile(path, data, 0o600); err != nil { // root's, 0600
		t.Fatal(err)
	}
	// nobody cannot reach the test binary in go's 0700 build directory.
	bin := filepath.Join(dir, "leases.test")
	if err := os.WriteFile(bin, readFile(t, os.Args[0]), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := helper(t, "open", path)
	cmd.Path, cmd.Args[0] = bin, bin
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	if !bytes.HasPrefix(out, []byte("access: ")) {
		t.Fatalf("Open by nobody of root's 0600 file: %s, want *AccessError matching fs.ErrPermission", out)
	}
	t.Logf("%s", bytes.TrimSpace(out))
	if _, err := MoveAside(path); err != nil {
		t.Fatalf("MoveAside: %v", err)
	}
}
