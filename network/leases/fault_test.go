package leases

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"
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

// validStore writes n records and returns the path and the records.
func validStore(t *testing.T, n int) (string, []Record) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "leases.db")
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	recs := make([]Record, n)
	for i := range recs {
		recs[i] = leased(i+1, fmt.Sprintf("owner-%05d", i+1), fmt.Sprintf("req-%d", i+1))
	}
	if err := s.Put(context.Background(), recs...); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return path, recs
}

// pageOf returns the offset of the page holding marker in the file.
func pageOf(t *testing.T, path, marker string) int64 {
	t.Helper()
	b := readFile(t, path)
	at := bytes.Index(b, []byte(marker))
	if at < 0 {
		t.Fatalf("%q not in %s", marker, path)
	}
	ps := int64(os.Getpagesize())
	return int64(at) / ps * ps
}

func overwrite(t *testing.T, path string, off int64, b []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

func randomBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, seed))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func TestCorruptFilesGiveCorruptError(t *testing.T) {
	ps := int64(os.Getpagesize())
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, path string)
	}{
		{"random bytes", func(t *testing.T, path string) {
			if err := os.WriteFile(path, randomBytes(1, 64<<10), 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{"a text file", func(t *testing.T, path string) {
			if err := os.WriteFile(path, []byte("not a database\n"), 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{"truncated to 100 bytes", func(t *testing.T, path string) { truncate(t, path, 100) }},
		{"truncated to 3 pages", func(t *testing.T, path string) { truncate(t, path, 3*ps) }},
		{"truncated to half", func(t *testing.T, path string) { truncate(t, path, fileSize(t, path)/2) }},
		{"truncated one page below its high-water mark", func(t *testing.T, path string) { truncate(t, path, highWater(t, path)-ps) }},
		{"both meta pages garbage", func(t *testing.T, path string) { overwrite(t, path, 0, randomBytes(2, int(2*ps))) }},
		{"garbage over a leaf page", func(t *testing.T, path string) {
			overwrite(t, path, pageOf(t, path, "owner-00500"), randomBytes(3, int(ps)))
		}},
		{"a leaf page's header says free page", func(t *testing.T, path string) {
			// page header: id (8 bytes), flags (2), count (2), overflow (4)
			overwrite(t, path, pageOf(t, path, "owner-00500")+8, []byte{0x10, 0x00})
		}},
		{"a branch element pointing past the file", func(t *testing.T, path string) {
			overwrite(t, path, pageOf(t, path, "owner-00500"), bytes.Repeat([]byte{0x01}, 8)) // page id
			overwrite(t, path, pageOf(t, path, "owner-00500")+8, []byte{0x01, 0x00})          // branch
		}},
		{"a directory", func(t *testing.T, path string) {
			os.Remove(path)
			if err := os.Mkdir(path, 0o700); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path, _ := validStore(t, 1000)
			tc.damage(t, path)
			damaged, _ := os.ReadFile(path)
			_, err := Open(path, Options{})
			var ce *CorruptError
			if !errors.As(err, &ce) || ce.Path != path {
				t.Fatalf("Open: %v, want *CorruptError", err)
			}
			t.Logf("%v", err)
			if tc.name == "a directory" {
				return
			}
			moved, err := MoveAside(path)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(moved, path+".corrupt-") || !bytes.Equal(readFile(t, moved), damaged) {
				t.Fatalf("MoveAside moved to %s, not the damaged file as it was", moved)
			}
			s, err := Open(path, Options{})
			if err != nil {
				t.Fatalf("Open after MoveAside: %v", err)
			}
			defer s.Close()
			if !s.Opened().Fresh {
				t.Fatal("the store after MoveAside is not Fresh")
			}
		})
	}
}

func truncate(t *testing.T, path string, size int64) {
	t.Helper()
	if err := os.Truncate(path, size); err != nil {
		t.Fatal(err)
	}
}

// highWater returns the size of the pages bbolt uses in the file at path
// (the file itself may be longer: bbolt grows it ahead).
func highWater(t *testing.T, path string) int64 {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var size int64
	if err := db.View(func(tx *bolt.Tx) error { size = tx.Size(); return nil }); err != nil {
		t.Fatal(err)
	}
	return size
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Size()
}

// TestRandomDamageNeverPanics writes random bytes over random spans of a
// valid store, many times over. Open must never panic or fault the process:
// it either opens (and then Load, Get and a write work or fail with an
// error) or returns a *CorruptError.
func TestRandomDamageNeverPanics(t *testing.T) {
	path, _ := validStore(t, 2000)
	orig := readFile(t, path)
	ps := os.Getpagesize()
	r := rand.New(rand.NewPCG(7, 7))
	opened, corrupt := 0, 0
	for round := range 300 {
		b := bytes.Clone(orig)
		for range 1 + r.IntN(3) {
			at, n := r.IntN(len(b)), 1+r.IntN(2*ps)
			if round%3 == 0 {
				at = 2*ps + r.IntN(len(b)-2*ps) // spare the meta pages: damage the data
			}
			for i := at; i < min(at+n, len(b)); i++ {
				b[i] = byte(r.Uint32())
			}
		}
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		s, err := Open(path, Options{})
		var ce *CorruptError
		switch {
		case err == nil:
			opened++
			_, lerr := s.Load()
			var re *RecordsError
			if lerr != nil && !errors.As(lerr, &re) && !errors.As(lerr, &ce) {
				t.Fatalf("round %d: Load: %T %v", round, lerr, lerr)
			}
			_, _, _ = s.Get(1 + r.IntN(2000))
			_ = s.Put(context.Background(), idle(1+r.IntN(2000)))
			s.Close()
		case errors.As(err, &ce):
			corrupt++
		default:
			t.Fatalf("round %d: Open: %T %v", round, err, err)
		}
	}
	t.Logf("300 damaged files: %d opened, %d refused as corrupt", opened, corrupt)
}

// TestOneDamagedMetaFallsBackToThePreviousCommit documents bbolt's crash
// recovery: of its two meta pages, the newer one (written last, so the one
// a crash can tear) is damaged, and the file opens as of the commit before.
// A torn meta means its commit never returned, so no reply depended on it.
func TestOneDamagedMetaFallsBackToThePreviousCommit(t *testing.T) {
	path := filepath.Join(t.TempDir(), "leases.db")
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// Each record in a commit of its own: the journal's checkpoint.
	for i := 1; i <= 2; i++ {
		if err := s.Put(ctx, idle(i)); err != nil {
			t.Fatal(err)
		}
		if err := s.flush(); err != nil {
			t.Fatal(err)
		}
	}
	var txid int
	if err := s.db.View(func(tx *bolt.Tx) error { txid = tx.ID(); return nil }); err != nil {
		t.Fatal(err)
	}
	s.Close()
	ps := int64(os.Getpagesize())
	overwrite(t, path, int64(txid%2)*ps+16, randomBytes(4, 64)) // the newest meta, past its page header

	s, err = Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	recs, err := s.Load()
	if err != nil || len(recs) != 1 || recs[0].Index != 1 {
		t.Fatalf("Load = %v, %v; want slot 1 only (the commit before the damaged one)", recs, err)
	}
}

func TestOpenInAMissingDirectoryIsNotCorrupt(t *testing.T) {
	path := filepath.Join(t.TempDir(), "missing", "leases.db")
	_, err := Open(path, Options{})
	var ce *CorruptError
	if !errors.Is(err, fs.ErrNotExist) || errors.As(err, &ce) {
		t.Fatalf("Open in a missing directory: %T %v, want ENOENT, not *CorruptError", err, err)
	}
}

func TestUndecodableRecordIsReportedNotFatal(t *testing.T) {
	path, recs := validStore(t, 50)
	// Slot 20's owner is field 2: tag byte 0x12, then its length. Field
	// number 0 is invalid protobuf.
	// (The owner also appears in the request index's key, without the tag.)
	b := readFile(t, path)
	field := append([]byte{0x12, byte(len("owner-00020"))}, "owner-00020"...)
	if n := bytes.Count(b, field); n != 1 {
		t.Fatalf("slot 20's owner field found %d times", n)
	}
	overwrite(t, path, int64(bytes.Index(b, field)), []byte{0x00})

	s, err := Open(path, Options{})
	if err != nil {
		t.Fatalf("Open: %v (a bad value is not a bad file)", err)
	}
	defer s.Close()
	got, err := s.Load()
	var re *RecordsError
	if !errors.As(err, &re) || len(re.Bad) != 1 || re.Bad[20] == nil {
		t.Fatalf("Load: %v, want *RecordsError naming slot 20", err)
	}
	if len(got) != len(recs)-1 {
		t.Fatalf("Load returned %d records, want the %d readable ones", len(got), len(recs)-1)
	}
	if _, _, err := s.Get(20); !errors.As(err, &re) {
		t.Fatalf("Get(20): %v, want *RecordsError", err)
	}
	if _, err := s.Update(context.Background(), 20, func(*Record) error { return nil }); !errors.As(err, &re) {
		t.Fatalf("Update(20): %v, want *RecordsError", err)
	}
	// Replacing it (after an operator decided) works and reindexes.
	if err := s.Put(context.Background(), leased(20, "owner-00020", "req-20")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Load(); err != nil {
		t.Fatal(err)
	}
	checkRequestIndex(t, s)
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

// tinyTmpfs mounts a tmpfs of size bytes on a new directory, unmounted at
// cleanup: root's and 0700, as a state directory must be (a tmpfs is 1777
// unless told).
func tinyTmpfs(t *testing.T, size int) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a tmpfs")
	}
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "mode=0700,size="+strconv.Itoa(size)); err != nil {
		t.Fatalf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}

// fillFS writes a file until the filesystem is full and returns its path.
func fillFS(t *testing.T, dir string) string {
	t.Helper()
	p := filepath.Join(dir, "filler")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4096)
	for {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("filling: %v", err)
			}
			return p
		}
	}
}

func TestFullFilesystem(t *testing.T) {
	dir := tinyTmpfs(t, 1<<20)
	path := filepath.Join(dir, "leases.db")
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	committed := map[int]bool{}
	for i := 1; i <= 20; i++ {
		if err := s.Put(ctx, leased(i, "ci", fmt.Sprintf("r%d", i))); err != nil {
			t.Fatal(err)
		}
		committed[i] = true
	}
	filler := fillFS(t, dir)

	// Writes fail once the file must grow (bbolt may first reuse free
	// pages it has). Big batches make it grow at once.
	next, batch := 21, 200
	var failed error
	for range 10 {
		recs := make([]Record, batch)
		for k := range recs {
			recs[k] = leased(next+k, "ci", fmt.Sprintf("r%d", next+k))
		}
		if failed = s.Put(ctx, recs...); failed != nil {
			break
		}
		for k := range recs {
			committed[next+k] = true
		}
		next += batch
	}
	if !errors.Is(failed, ErrNoSpace) || !errors.Is(failed, syscall.ENOSPC) {
		t.Fatalf("Put on a full filesystem: %v, want an error matching ErrNoSpace and ENOSPC", failed)
	}
	t.Logf("on a full filesystem: %v", failed)

	// Concurrent writes, batched: each is either committed and present, or
	// failed with ErrNoSpace and absent.
	var wg sync.WaitGroup
	errs := make([]error, 16)
	for w := range errs {
		wg.Go(func() {
			recs := make([]Record, 20)
			for k := range recs {
				i := 5000 + w*20 + k
				recs[k] = leased(i, "ci", fmt.Sprintf("r%d", i))
			}
			errs[w] = s.Put(ctx, recs...)
		})
	}
	wg.Wait()
	for w, err := range errs {
		ok := err == nil
		if !ok && !errors.Is(err, ErrNoSpace) {
			t.Fatalf("concurrent writer %d: %v", w, err)
		}
		for k := range 20 {
			if ok {
				committed[5000+w*20+k] = true
			}
		}
	}
	checkExactly(t, s, committed)
	// KeepAlive-style updates in place may or may not need a new page; a
	// failed one changes nothing.
	if _, err := s.Update(ctx, 1, func(r *Record) error { r.Expires = r.Expires.Add(time.Hour); return nil }); err != nil && !errors.Is(err, ErrNoSpace) {
		t.Fatalf("Update on a full filesystem: %v", err)
	}

	// Space is back: writes work, and the file is consistent after reopen.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	recs := make([]Record, batch)
	for k := range recs {
		recs[k] = leased(next+k, "ci", fmt.Sprintf("r%d", next+k))
		committed[next+k] = true
	}
	if err := s.Put(ctx, recs...); err != nil {
		t.Fatalf("Put once space is back: %v", err)
	}
	checkExactly(t, s, committed)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = Open(path, Options{}) // runs the consistency check
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	defer s.Close()
	checkExactly(t, s, committed)
	checkRequestIndex(t, s)
}

func checkExactly(t *testing.T, s *Store, want map[int]bool) {
	t.Helper()
	recs, err := s.Load()
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != len(want) {
		t.Fatalf("%d records, want %d", len(recs), len(want))
	}
	for _, r := range recs {
		if !want[r.Index] {
			t.Fatalf("slot %d recorded but its write failed", r.Index)
		}
	}
}

func TestOpenOnFullFilesystemLeavesNoFile(t *testing.T) {
	dir := tinyTmpfs(t, 256<<10)
	fillFS(t, dir)
	path := filepath.Join(dir, "leases.db")
	_, err := Open(path, Options{})
	if !errors.Is(err, ErrNoSpace) {
		t.Fatalf("Open on a full filesystem: %v, want ErrNoSpace", err)
	}
	if _, serr := os.Stat(path); !errors.Is(serr, fs.ErrNotExist) {
		t.Fatalf("a failed Open left %s behind: %v", path, serr)
	}
}

// TestCloseWaitsForWrites closes the store while writers run: every write
// that returned nil is in the file afterwards, every other one returned
// ErrClosed.
func TestCloseWaitsForWrites(t *testing.T) {
	path := filepath.Join(t.TempDir(), "leases.db")
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		written = map[int]bool{}
		started = make(chan struct{})
		once    sync.Once
	)
	for w := range 8 {
		wg.Go(func() {
			for n := range 200 {
				i := 1 + w*200 + n
				err := s.Put(context.Background(), idle(i))
				once.Do(func() { close(started) })
				switch {
				case err == nil:
					mu.Lock()
					written[i] = true
					mu.Unlock()
				case errors.Is(err, ErrClosed):
					return
				default:
					t.Errorf("Put: %v", err)
					return
				}
			}
		})
	}
	<-started
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	s, err = Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	checkExactly(t, s, written)
}

// TestKillDuringWritesWithoutFsync kills a process writing records from 16
// goroutines without fsync (SyncNever, what a store on tmpfs does) with
// SIGKILL at a random instant, round after round on the same file: every
// time the file opens whole (every page walked, bbolt's check passed) and
// holds every record whose Put had returned, with its lease id.
func TestKillDuringWritesWithoutFsync(t *testing.T) {
	path := filepath.Join(t.TempDir(), "leases.db")
	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 2))
	told := map[int]string{}
	base := 1
	for round := range 8 {
		// Kill once the writers are well under way, at a random instant.
		killAt := 50 + r.IntN(400)
		got, n := writeAndKill(t, path, base, killAt)
		for i, id := range got {
			told[i] = id
			base = max(base, i+1)
		}

		s, err := Open(path, Options{})
		if err != nil {
			t.Fatalf("round %d: after kill -9 with %d writes told: %v", round, n, err)
		}
		// The writers never paused, so the journal held what the file did
		// not: its replay is what this round tests.
		if s.Opened().Replayed == 0 {
			t.Errorf("round %d: nothing replayed from the journal after a kill in the middle of writes", round)
		}
		recs, err := s.Load()
		if err != nil {
			t.Fatalf("round %d: Load: %v", round, err)
		}
		inFile := map[int]string{}
		for _, rec := range recs {
			inFile[rec.Index] = rec.LeaseID
		}
		for i, id := range told {
			if inFile[i] != id {
				t.Errorf("round %d: slot %d: Put returned with lease %s, the store after kill -9 holds %q", round, i, id, inFile[i])
			}
		}
		checkRequestIndex(t, s)
		base = max(base, len(recs)+1) + killWriters // past any write that landed untold
		for _, rec := range recs {
			base = max(base, rec.Index+1)
		}
		s.Close()
		t.Logf("round %d: killed after %d writes told; %d records, every one told there, %d changes replayed from the journal",
			round, n, len(recs), s.Opened().Replayed)
	}
}

// writeAndKill runs the helper's write mode on path from index base and
// kills it (SIGKILL) once it has told killAt writes; it returns every
// write told (index -> lease id) and how many.
func writeAndKill(t *testing.T, path string, base, killAt int) (map[int]string, int) {
	t.Helper()
	cmd := helper(t, "write", path)
	cmd.Env = append(cmd.Env, helperEnv+"_BASE="+strconv.Itoa(base))
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	told, n := map[int]string{}, 0
	for line := range lines {
		var i int
		var id string
		if _, err := fmt.Sscanf(line, "put %d %s", &i, &id); err != nil {
			t.Fatalf("the helper said %q", line)
		}
		told[i] = id
		if n++; n == killAt {
			cmd.Process.Kill()
		}
	}
	cmd.Wait()
	if n < killAt {
		t.Fatalf("the helper stopped after %d writes, before it was killed", n)
	}
	return told, n
}
